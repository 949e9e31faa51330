"""The permissions of a published artifact: those any new file or directory gets under the process's umask.

The exporters write into ``tempfile.mkdtemp`` / ``tempfile.mkstemp`` temporaries (modes 0700 / 0600, private by
design) and rename them into place; renamed as they are, a TF Serving or onnxruntime process under another user
could not read them. :func:`publishable` gives the temporary, before the rename, the mode ``open`` and ``mkdir``
would have given it: 0666 or 0777 less the umask (0644 / 0755 under the usual 022; nothing for others under 077).
"""
import os
import stat
import threading

_UMASK_LOCK = threading.Lock()


def current_umask():
    """The process's umask, read without changing it where Linux shows it (``/proc/self/status``); elsewhere set
    to 0 and restored at once (a file another thread creates in between would get mode 0666/0777)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        umask = os.umask(0)
        os.umask(umask)
    return umask


def publishable(path):
    """Give ``path`` (a file, or a directory and everything under it; symbolic links are left alone) the modes
    a new file (0666) or directory (0777) gets under the current umask."""
    umask = current_umask()
    file_mode, dir_mode = 0o666 & ~umask, 0o777 & ~umask

    def set_mode(target):
        mode = os.lstat(target).st_mode
        if stat.S_ISDIR(mode):
            os.chmod(target, dir_mode)
        elif stat.S_ISREG(mode):
            os.chmod(target, file_mode)

    if os.path.isdir(path) and not os.path.islink(path):
        # Bottom-up, the top last: each directory is listed before its own mode can change.
        for folder, dirs, files in os.walk(path, topdown=False):
            for name in files + dirs:
                set_mode(os.path.join(folder, name))
    set_mode(path)
