"""The daemon's HTTP endpoint: a hardened HTTP/1.1 server with a route table (http.py), and its credentials
(config.py)."""
