"""The fault lab: real sshd hosts in network namespaces (see netlab.py)."""
