"""The daemon's HTTP endpoint: a hardened server with a route table (server.py) and its credentials (config.py)."""
