"""distrun's node program that issues one attempt's ssh certificate: run by root on the node that
keeps the user CA (role ssh_mesh: ``/etc/distrun/user_ca``, root's alone; the head).

``python3 -I -c <nodecommon.py + this file> sign '<config JSON>'``. Standard library and
``ssh-keygen``; Python 3.9 or newer. It makes a key pair for the attempt and has the CA certify it
for a login as the training user, with everything that scopes it written into the certificate:

- its principals: ``<user>@<host>`` for each of the run's hosts only (every node's sshd takes a
  certificate only when it names that node: role ssh_mesh's principals file);
- ``source-address``: the run's hosts' addresses only;
- a validity window of minutes (from 5 minutes back, for clocks a little apart);
- ``force-command``: the relay's mesh verb (what distrun sends over it: mpirun's daemons, the sync
  mode's rsync), unless the inventory gave that limit up.

It answers ``{"verb": "sign", "key": <private key>, "cert": <certificate>, "valid_minutes": N}``
(``{"verb": "sign", "error": why}`` when it cannot, with ``"no_root": true`` when it does not run
as root: the runner then goes on without a certificate);
the runner puts both into the attempt's folder (0600), where the run's ssh (mpirun's agent, the
stage step's copies) use them. A job of the run can read them: they open only the run's hosts,
only for minutes, only distrun's relay. The pair is made in a folder of root's under /run and
removed before the answer; nothing else changes. A bad call is one line on stderr and exit 2.
"""

import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile

if "NODECOMMON" not in globals():  # run as a file (the controller's tests): nodecommon.py from beside it
    _HEAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nodecommon.py")
    with open(_HEAD, encoding="utf-8") as _head:
        exec(compile(_head.read(), _HEAD, "exec"))  # the same one namespace as the composed source on a node

CA = "/etc/distrun/user_ca"
MAX_MINUTES = 24 * 60


def _check(verb: str, cfg: dict) -> None:
    for key in ("run", "user"):
        if not plain_name(cfg.get(key)):
            raise CallError(f"{verb}: {key} {cfg.get(key)!r} is empty or not a plain name")
    if not ATTEMPT.fullmatch(str(cfg.get("attempt", ""))):
        raise CallError(f"{verb}: attempt {cfg.get('attempt')!r} is not a number")
    hosts = cfg.get("hosts")
    if not (isinstance(hosts, list) and hosts and all(plain_name(h) for h in hosts)):
        raise CallError(f"{verb}: hosts {hosts!r} is not a list of plain names")
    addresses = cfg.get("addresses")
    if not (isinstance(addresses, list) and addresses):
        raise CallError(f"{verb}: addresses {addresses!r} is not a list of addresses")
    for a in addresses:
        try:
            ipaddress.ip_network(str(a), strict=False)
        except ValueError:
            raise CallError(f"{verb}: address {a!r} is not an IP address or network") from None
    minutes = cfg.get("minutes")
    if not (isinstance(minutes, int) and not isinstance(minutes, bool) and 1 <= minutes <= MAX_MINUTES):
        raise CallError(f"{verb}: minutes {minutes!r} is not a whole number from 1 to {MAX_MINUTES}")
    forced = cfg.get("forced", "")
    if not isinstance(forced, str) or any(c in forced for c in ",\n\r\0\""):
        raise CallError(f"{verb}: forced {forced!r} is not one plain command line")


def _keygen(argv: list, what: str) -> None:
    ran = subprocess.run(["ssh-keygen", "-q", *argv], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=60, check=False)
    if ran.returncode != 0:
        why = (ran.stderr.strip().splitlines() or [f"exit {ran.returncode}"])[-1]
        raise OSError(f"ssh-keygen could not {what}: {why[:300]}")


def sign(cfg: dict, ca: str = CA) -> dict:
    if os.geteuid() != 0 and ca == CA:
        return {"verb": "sign", "error": "the user CA is root's: the connection to the head must be root", "no_root": True}
    if not os.path.isfile(ca):
        return {"verb": "sign", "error": f"there is no user CA ({ca}) here: run distrun setup"}
    folder = tempfile.mkdtemp(prefix="distrun-sign-", dir="/run" if os.path.isdir("/run") and os.geteuid() == 0 else None)
    try:
        key = os.path.join(folder, "key")
        identity = f"distrun {cfg['user']} run {cfg['run']} attempt {cfg['attempt']}"
        _keygen(["-t", "ed25519", "-N", "", "-C", identity, "-f", key], "make the attempt's key pair")
        options = ["-O", "clear", "-O", "source-address=" + ",".join(str(a) for a in cfg["addresses"])]
        if cfg.get("forced"):
            options += ["-O", f"force-command={cfg['forced']}"]
        principals = ",".join(f"{cfg['user']}@{h}" for h in cfg["hosts"])
        _keygen(["-s", ca, "-I", identity, "-n", principals, "-V", f"-5m:+{cfg['minutes']}m", *options, f"{key}.pub"],
                "certify it")
        with open(key, encoding="utf-8") as fh:
            private = fh.read()
        with open(f"{key}-cert.pub", encoding="utf-8") as fh:
            cert = fh.read()
    except OSError as exc:
        return {"verb": "sign", "error": str(exc)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"verb": "sign", "key": private, "cert": cert, "valid_minutes": cfg["minutes"]}


def main(argv: list) -> int:
    return serve("sign.py", {"sign": sign}, argv, _check)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
