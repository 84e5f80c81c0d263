"""seccompProfile RuntimeDefault for containers that are local processes: containerd's default profile.

What a node gives a container whose profile is RuntimeDefault is containerd's
`contrib/seccomp/seccomp_default.go` (`DefaultProfile`, containerd v2.3.4): an allow-list whose default
action is EPERM, grown by the container's bounding capabilities (CAP_SYS_ADMIN allows mount, unshare,
setns, ...), `clone` only without namespace flags and `clone3` answering ENOSYS unless CAP_SYS_ADMIN,
`socket` for every family but AF_ALG and AF_VSOCK, `personality` only for the five harmless values.
The lists below are that file's, in its order; nothing is added or left out.

The filter is compiled by libseccomp (the system's libseccomp2, through pyseccomp) in the kubelet and
installed by `loader_argv`'s small program right before the container's command (after the mount and
PID namespaces are set up, which the profile would forbid, and before setpriv drops capabilities: like
runc, it installs the filter while it still has CAP_SYS_ADMIN, so no_new_privs is not forced on the
container; a cluster without CAP_SYS_ADMIN sets no_new_privs first, which the kernel then requires).
Syscalls the machine's libseccomp does not know yet (2.5.4 on Debian 12: mseal, statmount, listmount,
lsm_*, *xattrat, uretprobe) cannot be named in a filter and are denied like any unlisted one.
"""

from __future__ import annotations

import errno
import functools
import os
import platform
import sys
import tempfile

ALLOWED = """
    accept accept4 access adjtimex alarm bind brk cachestat capget capset chdir chmod chown chown32
    clock_adjtime clock_adjtime64 clock_getres clock_getres_time64 clock_gettime clock_gettime64 clock_nanosleep
    clock_nanosleep_time64 close close_range connect copy_file_range creat dup dup2 dup3 epoll_create
    epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait epoll_wait_old eventfd eventfd2
    execve execveat exit exit_group faccessat faccessat2 fadvise64 fadvise64_64 fallocate fanotify_mark fchdir
    fchmod fchmodat fchmodat2 fchown fchown32 fchownat fcntl fcntl64 fdatasync fgetxattr flistxattr flock fork
    fremovexattr fsetxattr fstat fstat64 fstatat64 fstatfs fstatfs64 fsync ftruncate ftruncate64 futex
    futex_requeue futex_time64 futex_wait futex_waitv futex_wake futimesat getcpu getcwd getdents getdents64
    getegid getegid32 geteuid geteuid32 getgid getgid32 getgroups getgroups32 getitimer getpeername getpgid
    getpgrp getpid getppid getpriority getrandom getresgid getresgid32 getresuid getresuid32 getrlimit
    get_robust_list getrusage getsid getsockname getsockopt get_thread_area gettid gettimeofday getuid getuid32
    getxattr getxattrat inotify_add_watch inotify_init inotify_init1 inotify_rm_watch io_cancel ioctl io_destroy
    io_getevents io_pgetevents io_pgetevents_time64 ioprio_get ioprio_set io_setup io_submit ipc kill
    landlock_add_rule landlock_create_ruleset landlock_restrict_self lchown lchown32 lgetxattr link linkat
    listen listmount listxattr listxattrat llistxattr _llseek lremovexattr lseek lsetxattr lsm_get_self_attr
    lsm_list_modules lsm_set_self_attr lstat lstat64 madvise membarrier memfd_create memfd_secret mincore mkdir
    mkdirat mknod mknodat mlock mlock2 mlockall map_shadow_stack mmap mmap2 mprotect mq_getsetattr mq_notify
    mq_open mq_timedreceive mq_timedreceive_time64 mq_timedsend mq_timedsend_time64 mq_unlink mremap mseal
    msgctl msgget msgrcv msgsnd msync munlock munlockall munmap name_to_handle_at nanosleep newfstatat
    _newselect open openat openat2 pause pidfd_open pidfd_send_signal pipe pipe2 pkey_alloc pkey_free
    pkey_mprotect poll ppoll ppoll_time64 prctl pread64 preadv preadv2 prlimit64 process_mrelease pselect6
    pselect6_time64 pwrite64 pwritev pwritev2 read readahead readlink readlinkat readv recv recvfrom recvmmsg
    recvmmsg_time64 recvmsg remap_file_pages removexattr removexattrat rename renameat renameat2 restart_syscall
    rmdir rseq rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo rt_sigreturn rt_sigsuspend
    rt_sigtimedwait rt_sigtimedwait_time64 rt_tgsigqueueinfo sched_getaffinity sched_getattr sched_getparam
    sched_get_priority_max sched_get_priority_min sched_getscheduler sched_rr_get_interval
    sched_rr_get_interval_time64 sched_setaffinity sched_setattr sched_setparam sched_setscheduler sched_yield
    seccomp select semctl semget semop semtimedop semtimedop_time64 send sendfile sendfile64 sendmmsg sendmsg
    sendto setfsgid setfsgid32 setfsuid setfsuid32 setgid setgid32 setgroups setgroups32 setitimer setpgid
    setpriority setregid setregid32 setresgid setresgid32 setresuid setresuid32 setreuid setreuid32 setrlimit
    set_robust_list setsid setsockopt set_thread_area set_tid_address setuid setuid32 setxattr setxattrat shmat
    shmctl shmdt shmget shutdown sigaltstack signalfd signalfd4 sigprocmask sigreturn socketcall socketpair
    splice stat stat64 statfs statfs64 statmount statx symlink symlinkat sync sync_file_range syncfs sysinfo tee
    tgkill time timer_create timer_delete timer_getoverrun timer_gettime timer_gettime64 timer_settime
    timer_settime64 timerfd_create timerfd_gettime timerfd_gettime64 timerfd_settime timerfd_settime64 times
    tkill truncate truncate64 ugetrlimit umask uname unlink unlinkat uretprobe utime utimensat utimensat_time64
    utimes vfork vmsplice wait4 waitid waitpid write writev
""".split()
SINCE_KERNEL_4_8 = ("process_vm_readv", "process_vm_writev", "ptrace")
BY_MACHINE = {"x86_64": ("arch_prctl", "modify_ldt"),
              "aarch64": ("arm_fadvise64_64", "arm_sync_file_range", "sync_file_range2", "breakpoint", "cacheflush",
                          "set_tls")}
EXTRA_ARCHES = {"x86_64": ("X86", "X32"), "aarch64": ("ARM",)}  # besides the native one, as containerd's arches()
BY_CAPABILITY = {
    "DAC_READ_SEARCH": ("open_by_handle_at",),
    "SYS_ADMIN": ("bpf", "clone", "clone3", "fanotify_init", "fsconfig", "fsmount", "fsopen", "fspick", "lookup_dcookie",
                  "mount", "mount_setattr", "move_mount", "open_tree", "perf_event_open", "quotactl", "quotactl_fd",
                  "setdomainname", "sethostname", "setns", "syslog", "umount", "umount2", "unshare"),
    "SYS_BOOT": ("reboot",),
    "SYS_CHROOT": ("chroot",),
    "SYS_MODULE": ("delete_module", "init_module", "finit_module"),
    "SYS_PACCT": ("acct",),
    "SYS_PTRACE": ("kcmp", "pidfd_getfd", "process_madvise", "process_vm_readv", "process_vm_writev", "ptrace"),
    "SYS_RAWIO": ("iopl", "ioperm"),
    "SYS_TIME": ("settimeofday", "stime", "clock_settime", "clock_settime64"),
    "SYS_TTY_CONFIG": ("vhangup",),
    "SYS_NICE": ("get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"),
    "SYSLOG": ("syslog",),
    "BPF": ("bpf",),
    "PERFMON": ("perf_event_open",),
}
AF_ALG, AF_VSOCK = 38, 40
PERSONALITIES = (0x0, 0x0008, 0x20000, 0x20008, 0xFFFFFFFF)
# CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWCGROUP
CLONE_NAMESPACES = 0x00020000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x02000000

# Runs between dumb-init and setpriv (or the command): installs the filter given in hex, then execs.
# Python ignores SIGPIPE and SIGXFSZ and an ignored signal stays ignored across exec: restored first.
_LOADER = """
import ctypes, os, signal, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL); signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
prog = bytes.fromhex(sys.argv[1])
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
libc = ctypes.CDLL(None, use_errno=True)
fprog = Prog(len(prog) // 8, prog)
def install():
    return libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
if not install() and not (ctypes.get_errno() == 13 and libc.prctl(38, 1, 0, 0, 0) == 0 and install()):
    sys.stderr.write("seccomp: installing the RuntimeDefault profile failed: %s\\n" % os.strerror(ctypes.get_errno()))
    sys.exit(128)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    sys.stderr.write("exec %s: %s\\n" % (sys.argv[2], exc.strerror))
    sys.exit(127 if exc.errno == 2 else 126)
"""


class SeccompUnavailable(RuntimeError):
    pass


def loader_argv(program: bytes) -> list[str]:
    """The prefix that runs the rest of the command line under `program` (a BPF filter)."""
    return [sys.executable, "-I", "-S", "-c", _LOADER, program.hex()]


@functools.lru_cache(maxsize=64)
def runtime_default(caps: tuple[str, ...]) -> bytes:
    """containerd's DefaultProfile for a container whose bounding set is `caps` (names without CAP_),
    compiled to a BPF program for this machine's architectures. Raises SeccompUnavailable when
    libseccomp cannot be loaded."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError, AttributeError) as exc:
        raise SeccompUnavailable(f"libseccomp cannot be loaded ({exc}); install libseccomp2") from None
    machine = platform.machine()
    flt = sc.SyscallFilter(sc.ERRNO(errno.EPERM))
    for arch in EXTRA_ARCHES.get(machine, ()):
        flt.add_arch(getattr(sc.Arch, arch))
    names = [*ALLOWED, *(SINCE_KERNEL_4_8 if _kernel() >= (4, 8) else ()), *BY_MACHINE.get(machine, ())]
    for cap in caps:
        names += BY_CAPABILITY.get(cap, ())

    def allow(name: str, *args, action=sc.ALLOW) -> None:
        try:
            flt.add_rule(action, name, *args)
        except OSError:
            if sc.resolve_syscall(sc.Arch.NATIVE, name) != -1:  # __NR_SCMP_ERROR: a name it does not know
                raise
            # unknown to this libseccomp: it cannot be allowed, so it stays denied (runc skips it too)
    for name in dict.fromkeys(names):
        allow(name)
    # each its own rule: libseccomp ORs rules, while conditions within one rule are ANDed
    allow("socket", sc.Arg(0, sc.LT, AF_ALG))
    allow("socket", sc.Arg(0, sc.EQ, AF_ALG + 1))
    allow("socket", sc.Arg(0, sc.GT, AF_VSOCK))
    for value in PERSONALITIES:
        allow("personality", sc.Arg(0, sc.EQ, value))
    if "SYS_ADMIN" not in caps:
        allow("clone", sc.Arg(1 if machine.startswith("s390") else 0, sc.MASKED_EQ, CLONE_NAMESPACES, 0))
        allow("clone3", action=sc.ERRNO(errno.ENOSYS))  # so that libc falls back to clone, whose flags are checked
    with tempfile.TemporaryFile() as fh:
        flt.export_bpf(fh)
        fh.seek(0)
        return fh.read()


def _kernel() -> tuple[int, int]:
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)
