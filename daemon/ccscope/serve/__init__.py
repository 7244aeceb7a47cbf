"""`ccscope serve`: the far end of real-path scenarios (protocol.py: the control protocol and its client;
server.py: the server). Imports neither the scenario runner nor plotting."""
