"""The cluster as the inventory describes it: read through Ansible and checked, its rules written once
(addresses, GPUs, slots, the hostfile), the contract's defaults, a Slurm the user does not
administer, a new inventory folder.

(DEVELOPING.md's module table has this text as the row of `inventory/`.)
"""
