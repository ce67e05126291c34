# ruff: noqa: F821 - as_user, last_line and ProbeConfig are userprobe.py's and probe_config.py's,
# composed in front of this file
"""The run's container image on one node, as the training user's runtime sees it (rootless podman
keeps images per user). One of the preflight probe's parts, composed in front of probe.py (the
one recipe: runner/distrun/transport/nodeprog.py) and called by it; standard library only.

The image's id (its configuration's digest: the same content on every node, whichever registry
or archive it came from), the runtime's storage driver (vfs copies the whole image at every
container start) and, once it is there, what a rank will find inside it: a ``python3`` on its
PATH, the modules the run imports, torch's version where it has torch (torchrun's flags need a
recent one), where the node's own mpirun starts each rank in a container of it, the
Open MPI that mpi4py loads there (its major version must be the node's), and the shared folder as
the ranks will see it: mounted at its own path and entered, as a rank enters its run directory.
Rootless podman's pause process keeps the mounts it saw when it first started, so a folder
mounted again since (sshfs after a dropped connection, setup switching modes) is another folder,
or none, inside its containers: the probe compares the folder's device and inode inside and out.
Where the image is missing, the names the user's store does hold (for a "did you mean").
The look inside starts one short-lived container with the run's own namespaces (host network,
IPC and process ids: no new /proc is mounted, which rootless podman inside a container cannot do)
as the training user; its answer is one JSON line. Nothing is written: the container is removed.
"""

import json

# Run by the image's python3, isolated (-I): which modules it can find (found, not imported:
# importing torch takes seconds) and, asked for, the MPI library mpi4py loads, without MPI_Init.
IMAGE_PYTHON_CHECK = r"""
import importlib.util, json, os, platform, re, sys
out = {"python": platform.python_version(), "missing": []}
for name in json.loads(sys.argv[1]):
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        out["missing"].append(name)
try:
    has_torch = importlib.util.find_spec("torch") is not None
except (ImportError, ValueError):
    has_torch = False
if has_torch:
    try:
        from importlib import metadata
        out["torch"] = metadata.version("torch")
    except Exception:
        spec = importlib.util.find_spec("torch")
        try:
            with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as f:
                out["torch"] = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", f.read()).group(1)
        except Exception:
            out["torch"] = ""
if sys.argv[3]:
    try:
        st = os.stat(sys.argv[3])
        out["folder"] = f"{st.st_dev}:{st.st_ino}"
    except OSError as exc:
        out["folder_error"] = f"{exc.strerror}: {sys.argv[3]}"
if sys.argv[2] == "1":
    try:
        import mpi4py
        mpi4py.rc.initialize = mpi4py.rc.finalize = False
        from mpi4py import MPI
        out["mpi"] = MPI.Get_library_version().strip().splitlines()[0]
    except Exception as exc:
        out["mpi_error"] = f"{type(exc).__name__}: {exc}"[:200]
print(json.dumps(out))
"""


def _folder_here(cfg: ProbeConfig, folder: str) -> str:
    """The shared folder's device and inode as the training user sees it on the node."""
    proc = as_user(cfg, ["stat", "-L", "-c", "%d:%i", folder], timeout=30)
    return (proc.stdout or "").strip() if proc.returncode == 0 else ""


def image_contents(cfg: ProbeConfig, runtime: str, ref: str, modules: list[str], mpi: bool, folder: str = "") -> dict:
    """What a rank finds in the image: its python3's version, the modules it lacks, torch's
    version, its MPI, and ``folder`` (the shared folder) mounted and entered as the ranks do."""
    # A pid namespace of its own: whatever the image starts ends with it (this runs outside every unit).
    argv = [runtime, "run", "--rm", "--network=host", "--entrypoint", "python3"]
    if runtime == "podman" and cfg.user != "root":
        argv.append("--userns=keep-id")  # rootless: the user's own uid inside, as the ranks run
    if folder:
        argv += ["--volume", f"{folder}:{folder}", "--workdir", folder]  # as container-run.sh mounts the run's folders
    argv += [ref, "-I", "-c", IMAGE_PYTHON_CHECK, json.dumps(sorted(modules)), "1" if mpi else "0", folder]
    proc = as_user(cfg, argv, timeout=120)
    lines = (proc.stdout or "").strip().splitlines()
    if proc.returncode == 0 and lines:
        try:
            said = json.loads(lines[-1])
        except ValueError:
            said = None
        if isinstance(said, dict):
            if folder:
                said["folder_here"] = _folder_here(cfg, folder)
            return said
    return {"error": last_line(proc.stderr or proc.stdout) or f"exit {proc.returncode}"}


def _names(cfg: ProbeConfig, runtime: str) -> list[str]:
    """The image names the user's store holds (for a "did you mean"), at most 200."""
    proc = as_user(cfg, [runtime, "images", "--format", "{{.Repository}}:{{.Tag}}"], timeout=60)
    if proc.returncode != 0:
        return []
    return sorted({n.strip() for n in (proc.stdout or "").splitlines() if n.strip() and "<none>" not in n})[:200]


def _driver(cfg: ProbeConfig, runtime: str) -> str:
    """The runtime's storage driver (overlay, vfs, ...), or "" when it does not say."""
    fmt = "{{.Store.GraphDriverName}}" if runtime == "podman" else "{{.Driver}}"
    proc = as_user(cfg, [runtime, "info", "--format", fmt], timeout=60)
    return (proc.stdout or "").strip().splitlines()[0][:40] if proc.returncode == 0 and (proc.stdout or "").strip() else ""


def probe_image(cfg: ProbeConfig, image: dict) -> dict:
    """The image's id as the training user's runtime has it, or why there is none; with the id,
    what is inside it (``contents``) when the run says what it needs there."""
    ref, runtime = str(image.get("ref", "")), str(image.get("runtime", ""))
    out: dict = {"ref": ref, "runtime": runtime, "user": cfg.user, "id": ""}
    if image.get("id"):  # the id 'distrun push-image' put there, which the judge asks of every node
        out["pushed"] = str(image["id"])
    proc = as_user(cfg, [runtime, "image", "inspect", "--format", "{{.Id}}", ref], timeout=60)
    first = (proc.stdout or "").strip().splitlines()[:1]
    if proc.returncode != 0 or not first:
        out["error"] = last_line(proc.stderr or proc.stdout) or f"exit {proc.returncode}"
        out["names"] = _names(cfg, runtime)
        return out
    image_id = first[0].strip()
    out["id"] = image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"
    out["driver"] = _driver(cfg, runtime)
    if "modules" in image and out.get("pushed", out["id"]) == out["id"]:  # never an image nobody pushed
        out["contents"] = image_contents(cfg, runtime, ref, image.get("modules") or [], bool(image.get("mpi")),
                                         cfg.shared_dir)
    return out
