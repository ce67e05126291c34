"""How the runner reaches the nodes: playbooks through ansible-runner and Ansible's own entry point, a
shell over a node's ssh master, the node programs as the runner calls them, the run directory's
names, one attempt's handshake with run.yml.

(DEVELOPING.md's module table has this text as the row of `transport/`.)
"""
