"""distrun: provision a distributed-training cluster with Ansible and run jobs on it."""

from __future__ import annotations

__version__ = "0.1.0"
