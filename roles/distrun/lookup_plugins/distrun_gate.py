"""Lookup of role distrun: wait for the controller's answer in a gate file.

A run's controller decides some things while ansible-playbook runs (whether the run holds its
hosts: distrun.run.busy.Pending); a task that must not go on before the answer reads it with this
lookup, which waits until the file exists. The controller writes it whole (a rename), once.
"""

from __future__ import annotations

import time

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: distrun_gate
author: distrun
short_description: Wait for the controller's answer in a gate file
description:
  - Returns the text of each file named, stripped, once the file exists; fails when one does not
    appear within O(timeout) seconds.
options:
  _terms:
    description: Paths of the gate files, on the controller.
    required: true
  timeout:
    description: Seconds to wait for each file.
    type: float
    default: 60
"""

RETURN = r"""
_raw:
  description: The text of each file, stripped.
  type: list
  elements: str
"""

POLL_S = 0.005


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        timeout = float(self.get_option("timeout"))
        answers = []
        for term in terms:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    with open(str(term), encoding="utf-8") as fh:
                        answers.append(fh.read().strip())
                    break
                except FileNotFoundError:
                    if time.monotonic() > deadline:
                        raise AnsibleLookupError(f"no answer in {term} after {timeout:g} s: the controller "
                                                 "that started this run stopped answering") from None
                    time.sleep(POLL_S)
        return answers
