"""The command line: thin click commands over the library core."""
