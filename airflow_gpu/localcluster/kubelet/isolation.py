"""A container's view of the filesystem: a private mount namespace whose root is image-like.

Why: a container process runs on the host, so without this its absolute paths (`/airflow/xcom`,
`/var/run/secrets/...`, `/tmp`) would be the host's, and it could read any host file its uid can (a
token file, /etc/shadow, Airflow's password file). The root is composed from an allow-list instead,
once per kubelet (`image_root`):
  - an image skeleton in the state dir: the top-level directories an image has (empty /tmp, /run,
    /var, /root, /home, /opt), the host's /bin, /lib* symlinks as they are, and a curated /etc
    (passwd, group, hosts, resolv.conf, nsswitch.conf, ld.so.cache, certificates, alternatives,
    localtime...: files copied, trees every user can read bound read-only; never shadow, gshadow,
    sudoers, ssh or ssl/private, nor any file others cannot read). It is a snapshot: /etc edited on the
    host later reaches containers when the cluster restarts;
  - the host's system directories (/usr, and /bin, /sbin, /lib* where they are not symlinks into it)
    and what runs this project's Python: the interpreter's prefix and base prefix, and the entries of
    the cluster's import path (editable installs' mappings too), bound read-only at their paths;
    nothing under /tmp, /root, HOME, AIRFLOW_HOME or the state dir unless it is the interpreter or the
    project itself, and those of them that lie inside a bound directory are covered by an empty tmpfs.
In the child, between fork and exec, the kubelet
  1. unshares the mount namespace (nothing mounted there propagates back to the host),
  2. mounts an overlay whose lower layer is the skeleton and whose upper layer lives in the pod's
     directory (a write anywhere in the root, /etc and /tmp included, lands there, never on the host),
  3. binds the system and runtime directories read-only, /proc and /sys, and a minimal /dev (a tmpfs
     with null, zero, full, random, urandom, tty, ptmx, pts and any GPU device nodes: no disks), gives
     the container a private 64 MiB tmpfs at /dev/shm (as a container runtime does), and binds the
     pod's own directory at its real path,
  4. chroots into that root and binds each volume at the mountPath the container asked for,
  5. runs the command in its own PID namespace (`unshare --pid --fork --mount-proc`) under dumb-init as
     PID 1: the container sees only its own processes in /proc, and PID 1 forwards SIGTERM (a process
     that is PID 1 itself would ignore it). Without this, a container's `kill $(pgrep sh)`, which
     KubernetesPodOperator runs in its XCom sidecar, would signal the host's processes.
`kubectl exec` joins the container's namespaces and root with nsenter.
This needs CAP_SYS_ADMIN (the cluster runs as root, as in CI) and util-linux's unshare and nsenter. Where it is not permitted, the kubelet
does not run the container unconfined: it fails to start with a Warning Event naming the reason and the
fix (run as root, or `podIsolation: none` in the cluster spec to run pods on the host filesystem knowingly).

The plan is computed in the parent; the child only makes syscalls (no imports, no allocation-heavy work
between fork and exec in a threaded parent).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
DEV_SHM_SIZE = "64m"  # a container runtime's default /dev/shm
UNSHARE, NSENTER = shutil.which("unshare"), shutil.which("nsenter")
DUMB_INIT = shutil.which("dumb-init", path=f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}")


def container_argv(argv: list[str]) -> list[str]:
    """The command line of a confined container: a PID namespace of its own, dumb-init as its PID 1."""
    return [UNSHARE, "--pid", "--fork", "--mount-proc", "--kill-child", "--", DUMB_INIT, "--", *argv]


def container_init_pid(launcher_pid: int) -> int | None:
    """The container's PID 1 (dumb-init, the child of unshare) as the host sees it; None if gone."""
    try:
        with open(f"/proc/{launcher_pid}/task/{launcher_pid}/children") as fh:
            children = fh.read().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def enter(init_pid: int, workdir: str) -> None:
    """In the child of `kubectl exec`, before exec: join the container's mount namespace and root (as
    nsenter --mount --root) and its working dir. The root is opened before setns: after it the host's
    paths are gone. Then exec `exec_argv`: nsenter joins the PID namespace (only a child can be in it)."""
    try:
        root = os.open(f"/proc/{init_pid}/root", os.O_RDONLY | os.O_DIRECTORY)
        namespace = os.open(f"/proc/{init_pid}/ns/mnt", os.O_RDONLY)
    except OSError as exc:
        raise OSError(exc.errno, f"the container's process {init_pid} is gone: {exc.strerror}") from None
    if _libc.setns(namespace, CLONE_NEWNS) != 0:
        _fail("setns(CLONE_NEWNS)")
    os.fchdir(root)
    os.chroot(".")
    os.chdir(workdir)


def exec_argv(argv: list[str]) -> list[str]:
    """`kubectl exec`'s command line, run after enter(): into the PID namespace, whose PID 1 (dumb-init)
    is /proc/1 in the container's own /proc."""
    return [NSENTER, "--target=1", "--pid", "--", *argv]


@dataclass(frozen=True)
class Bind:
    source: str  # host path (inside the new root: the pod directory is bound at its real path)
    target: str  # absolute path inside the container
    read_only: bool = False
    is_file: bool = False


# what an image has at its top level (the host's versions, read-only) and what programs read from /etc;
# never shadow, gshadow, sudoers, ssh, ssl/private or machine-id, nor a file others cannot read
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
ETC_ENTRIES = ("passwd", "group", "hosts", "hostname", "resolv.conf", "nsswitch.conf", "host.conf", "gai.conf",
               "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ld.so.preload", "ssl/certs", "ssl/openssl.cnf",
               "ca-certificates", "ca-certificates.conf", "pki/tls/certs", "pki/ca-trust", "crypto-policies",
               "alternatives", "localtime", "timezone", "protocols", "services", "rpc", "networks", "ethers",
               "mime.types", "os-release", "debian_version", "lsb-release", "shells", "profile", "bash.bashrc",
               "inputrc", "terminfo", "magic", "magic.mime", "mtab", "fonts", "python3", "python3.11")
EMPTY_DIRS = (("proc", 0o555), ("sys", 0o555), ("dev", 0o755), ("run", 0o755), ("tmp", 0o1777), ("var", 0o755),
              ("var/tmp", 0o1777), ("root", 0o700), ("home", 0o755), ("opt", 0o755), ("mnt", 0o755), ("srv", 0o755))
# /dev holds these nodes of the host's, /dev/pts (kubectl exec's terminals) and GPUs; never a disk
DEVICES = ("null", "zero", "full", "random", "urandom", "tty", "ptmx")
GPU_DEVICE_PREFIXES = ("nvidia", "dri")
DEV_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
             ("stderr", "/proc/self/fd/2"))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True)
class ImageRoot:
    """The part of every container's root that is the same for all pods of a kubelet."""

    lower: Path  # the skeleton: the overlay's lower layer (never changed while a pod runs)
    binds: tuple[tuple[str, bool], ...]  # (host path, is a file): bound read-only at the same path
    masks: tuple[str, ...]  # host dirs never shown that lie inside a bound one: an empty tmpfs if they exist
    devices: tuple[tuple[str, str | None], ...]  # (name under /dev, None or its symlink's target as on the host)

    def shows(self, path: str) -> bool:
        """Whether a host path is in the container's root (through a read-only bind)."""
        real = os.path.realpath(path)
        return any(_under(real, b) for b, _ in self.binds) and not any(_under(real, m) for m in self.masks)


def hidden_roots(state_dir: Path) -> list[str]:
    """Host directories no container sees (except what the kubelet binds from them: its pod dir)."""
    home = os.environ.get("HOME") or str(Path.home())
    candidates = ["/tmp", "/var/tmp", "/dev/shm", "/root", tempfile.gettempdir(), home, str(Path.home()),
                  os.environ.get("AIRFLOW_HOME") or os.path.join(home, "airflow"), str(state_dir)]
    return sorted({os.path.realpath(p) for p in candidates if p} - {"/"})


def runtime_paths() -> tuple[set[str], list[str]]:
    """(trusted, others): what runs this project's Python as the cluster runs it. Trusted: the
    interpreter's prefixes, this project's source and editable installs' mapped directories, shown even
    where they lie in a hidden root (pyenv under /root, a worktree under /tmp); others: its import path."""
    trusted = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, str(Path(__file__).resolve().parents[3])}
    for name, module in list(sys.modules.items()):
        if name.startswith("__editable__"):  # setuptools' editable finders: MAPPING and NAMESPACES
            trusted.update((getattr(module, "MAPPING", None) or {}).values())
            for dirs in (getattr(module, "NAMESPACES", None) or {}).values():
                trusted.update(dirs)
    return trusted, [p for p in sys.path if p]


def image_root(state_dir: Path) -> ImageRoot:
    """Build the skeleton under the state dir (once per kubelet) and list what is bound into it."""
    lower = state_dir / "image-root"
    shutil.rmtree(lower, ignore_errors=True)
    lower.mkdir(parents=True)
    os.chmod(lower, 0o755)
    for name, mode in EMPTY_DIRS:
        (lower / name).mkdir(exist_ok=True)
        os.chmod(lower / name, mode)
    if os.path.islink("/var/run"):
        os.symlink(os.readlink("/var/run"), lower / "var" / "run")
    public_trees = []  # bound, not copied: hundreds of symlinks (ssl/certs) take long to create
    for entry in ETC_ENTRIES:
        src = f"/etc/{entry}"
        if os.path.isdir(src) and not os.path.islink(src) and _all_public(src):
            public_trees.append(src)
        elif os.path.lexists(src):
            (lower / "etc" / entry).parent.mkdir(parents=True, exist_ok=True)
            _copy_public(src, str(lower / "etc" / entry))
    hidden = hidden_roots(state_dir)
    binds: list[str] = []
    for name in SYSTEM_DIRS:
        if os.path.islink(f"/{name}"):
            os.symlink(os.readlink(f"/{name}"), lower / name)
        elif os.path.isdir(f"/{name}"):
            binds.append(f"/{name}")
    trusted, others = runtime_paths()
    for path in sorted(trusted) + others:
        path = os.path.abspath(path)
        real = os.path.realpath(path)
        if not os.path.exists(real) or real == "/" or any(_under(real, b) for b in binds):
            continue
        if path not in trusted and any(_under(real, h) or _under(h, real) for h in hidden):
            continue  # inside a hidden root, or would show one
        if path != real and os.path.realpath(os.path.dirname(path)) == os.path.dirname(path) \
                and not os.path.lexists(lower / path.lstrip("/")):
            (lower / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(path), lower / path.lstrip("/"))  # the link itself, as on the host
        binds = [b for b in binds if not _under(b, real)] + [real]
    binds += public_trees
    out = []
    for path in sorted(binds):
        is_file = not os.path.isdir(path)
        mountpoint = lower / path.lstrip("/")
        mountpoint.parent.mkdir(parents=True, exist_ok=True)
        if is_file:
            mountpoint.touch()
        else:
            mountpoint.mkdir(exist_ok=True)
        out.append((path, is_file))
    for directory, children, files in os.walk(lower):  # traversable by any user, as an image's (pyenv in /root)
        if children or files or directory != str(lower / "root"):
            os.chmod(directory, os.stat(directory).st_mode | 0o555)
    masks = tuple(h for h in hidden if any(_under(h, b) and h != b for b in binds))
    names = [n for n in DEVICES if os.path.lexists(f"/dev/{n}")]
    names += sorted(n for n in os.listdir("/dev") if n.startswith(GPU_DEVICE_PREFIXES))
    devices = tuple((n, os.readlink(f"/dev/{n}") if os.path.islink(f"/dev/{n}") else None) for n in names)
    return ImageRoot(lower, tuple(out), masks, devices)


def _all_public(top: str) -> bool:
    """Whether others can read every file and enter every directory of a tree (symlinks aside)."""
    for directory, _, files in os.walk(top):
        if os.stat(directory).st_mode & 0o005 != 0o005:
            return False
        for name in files:
            mode = os.lstat(os.path.join(directory, name)).st_mode
            if not stat.S_ISLNK(mode) and not mode & 0o004:
                return False
    return True


def _copy_public(src: str, dst: str) -> None:
    """Copy a file, symlink or tree of /etc into the skeleton, leaving out what others cannot read. A
    symlink stays one where its target is in the container too (/etc/localtime into /usr), else its
    target is copied (resolv.conf into /run, by systemd-resolved)."""
    if os.path.islink(src):
        target = os.path.realpath(src)
        if not os.path.exists(target) or any(_under(target, top) for top in ("/usr", "/etc", "/proc")):
            os.symlink(os.readlink(src), dst)
            return
        src = target
    st = os.stat(src)
    if not st.st_mode & 0o004:
        return
    if os.path.isdir(src):
        if st.st_mode & 0o001:
            os.makedirs(dst, exist_ok=True)
            for name in os.listdir(src):
                _copy_public(os.path.join(src, name), os.path.join(dst, name))
    elif os.path.isfile(src):
        shutil.copy2(src, dst)


@dataclass
class MountPlan:
    rootfs: Path  # <pod dir>/.rootfs/<container>-<restart>
    pod_dir: Path
    image: ImageRoot
    workdir: Path
    binds: list[Bind] = field(default_factory=list)
    shm_is_volume: bool = False
    read_only_root: bool = False  # readOnlyRootFilesystem: the root and the working dir, not the volumes
    masks: list[str] = field(default_factory=list)  # the image's masks that exist now (set by prepare)

    def prepare(self) -> None:
        """In the parent: the overlay's directories, inside the pod directory."""
        for name in ("upper", "work", "merged"):
            (self.rootfs / name).mkdir(parents=True, exist_ok=True)
        self.masks = [m for m in self.image.masks if os.path.isdir(m)]

    @property
    def error_path(self) -> Path:
        return self.rootfs / "setup-error"

    def apply(self) -> None:
        """In the child, before exec. Raises OSError naming the step that failed, and writes it to
        error_path (the exception itself does not cross exec back to the parent)."""
        fd = os.open(str(self.error_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            self._apply()
        except OSError as exc:
            os.write(fd, str(exc).encode())
            raise

    def setup_error(self) -> str:
        try:
            return self.error_path.read_text().strip() or "unknown error"
        except OSError:
            return "unknown error"

    def _apply(self) -> None:
        merged = str(self.rootfs / "merged")
        if _libc.unshare(CLONE_NEWNS) != 0:
            _fail("unshare(CLONE_NEWNS)")
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        _mount("overlay", merged, "overlay", 0,
               f"lowerdir={self.image.lower},upperdir={self.rootfs / 'upper'},workdir={self.rootfs / 'work'}")
        for path, _ in self.image.binds:  # mount points are in the skeleton
            _mount(path, merged + path, None, MS_BIND | MS_REC)
            _mount(None, merged + path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_REC)
        for path in self.masks:  # 0711: a container running as another user still reaches its pod directory
            _mount("tmpfs", merged + path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0711,size=1m")
        for sub in ("proc", "sys"):
            _mount(f"/{sub}", f"{merged}/{sub}", None, MS_BIND | MS_REC)
        self._dev(f"{merged}/dev")
        os.makedirs(f"{merged}{self.pod_dir}", exist_ok=True)
        _mount(str(self.pod_dir), f"{merged}{self.pod_dir}", None, MS_BIND)
        os.chroot(merged)
        os.chdir("/")
        for bind in self.binds:  # inside the new root: symlinks in mount paths resolve there, not on the host
            if bind.is_file:
                os.makedirs(os.path.dirname(bind.target) or "/", exist_ok=True)
                if not os.path.exists(bind.target):
                    os.close(os.open(bind.target, os.O_CREAT | os.O_WRONLY, 0o644))
            else:
                os.makedirs(bind.target, exist_ok=True)
            _mount(bind.source, bind.target, None, MS_BIND | MS_REC)
            if bind.read_only:
                _mount(None, bind.target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_REC)
        if self.read_only_root:  # the volumes are mounts of their own and stay writable
            _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY)
            _mount(None, str(self.pod_dir), None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        os.chdir(str(self.workdir))

    def _dev(self, dev: str) -> None:
        """A container runtime's /dev: a tmpfs with the harmless nodes, terminals, GPUs and /dev/shm."""
        _mount("tmpfs", dev, "tmpfs", MS_NOSUID, "mode=0755,size=64k")
        for name, link in self.image.devices:
            if link is not None:
                os.symlink(link, f"{dev}/{name}")
                continue
            if os.path.isdir(f"/dev/{name}"):
                os.mkdir(f"{dev}/{name}")
            else:
                os.close(os.open(f"{dev}/{name}", os.O_CREAT | os.O_WRONLY, 0o644))
            _mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND | MS_REC)
        os.mkdir(f"{dev}/pts")
        _mount("/dev/pts", f"{dev}/pts", None, MS_BIND)
        for name, target in DEV_LINKS:
            os.symlink(target, f"{dev}/{name}")
        os.mkdir(f"{dev}/shm", 0o1777)
        if not self.shm_is_volume:
            _mount("tmpfs", f"{dev}/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={DEV_SHM_SIZE}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if _libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(),
                   ctypes.c_ulong(flags), data and data.encode()) != 0:
        _fail(f"mount {target}")


def _fail(step: str) -> None:
    errno = ctypes.get_errno()
    raise OSError(errno, f"{step}: {os.strerror(errno)}")


def probe(scratch: Path, image: ImageRoot) -> str | None:
    """None when containers can be confined here, else why not (run once when the kubelet starts)."""
    pod_dir = scratch / "isolation-probe"
    plan = MountPlan(pod_dir / ".rootfs" / "probe", pod_dir, image, pod_dir)
    plan.prepare()
    try:
        missing = [name for name, path in (("unshare", UNSHARE), ("nsenter", NSENTER), ("dumb-init", DUMB_INIT))
                   if path is None]
        if missing:
            return f"{' and '.join(missing)} not found (util-linux; dumb-init is a dependency of airflow-gpu)"
        result = subprocess.run(container_argv(["/bin/sh", "-c", "echo x > /probe-write; echo $$"]),
                                preexec_fn=plan.apply, capture_output=True, text=True, timeout=30)
        if result.returncode != 0 or not (plan.rootfs / "upper" / "probe-write").exists():
            return f"a confined test process failed: {result.stderr.strip()[-300:]}"
        if result.stdout.strip() != "2":  # PID 1 is dumb-init, the command the first process under it
            return f"the container's PID namespace was not set up (its shell has PID {result.stdout.strip()!r})"
        return None
    except (OSError, subprocess.SubprocessError):
        return f"the mount namespace could not be set up ({plan.setup_error()}); it needs CAP_SYS_ADMIN"
    finally:
        shutil.rmtree(pod_dir, ignore_errors=True)
