from relay.cli import main

main(prog_name="relay")
