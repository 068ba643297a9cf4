"""A peer sending the largest valid events as fast as the relay takes them, until killed.

    python tests/flood_proc.py ADDRESS RUN RANK KIND

KIND ``text``: frames just under schema.MAX_FRAME_BYTES of plain text (a journal line of about
the same size); ``control``: control characters, as many as fit a journal line of
schema.MAX_LINE_BYTES (6 bytes each in JSON: the largest line a valid event makes). Prints
``ready`` once connected; reads and discards the relay's acks.
"""
import sys
import time

import zmq

from relay.wire import auth, encoding, schema

address, run, rank, kind = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
prefix = encoding.compact_prefix({"v": 1, "run": run, "rank": rank, "local_rank": 0, "world_size": 1, "host": "flood"})
text = "a" * (schema.MAX_FRAME_BYTES - 1024) if kind == "text" else "\x01" * ((schema.MAX_LINE_BYTES - 1024) // 6)
ctx = zmq.Context()
sock = ctx.socket(zmq.DEALER)
auth.secure_client(sock, address)  # as a job's own process would
sock.connect(address)
print("ready", flush=True)
seq = 0
while True:
    sock.send(encoding.compact_frame(prefix, [encoding.encode_row(seq, time.time(), "params", None, None, None,
                                                              {"s": text})]))
    seq += 1
    while sock.poll(0):
        sock.recv()
