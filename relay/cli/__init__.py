"""The command line and its viewers (tail, follow, plot); may import every other room."""
