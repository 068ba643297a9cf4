from relay.cli.main import main

main(prog_name="relay")
