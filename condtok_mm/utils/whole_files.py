"""Files that are replaced whole: a reader, or a run stopped while one is written, finds the previous version or the
new one, never part of one."""
import os


def write_whole(path, write):
    """Call ``write(temporary)`` with a path beside ``path`` and rename what it wrote to ``path`` (os.replace: one
    step on POSIX); the temporary file is removed where ``write`` fails or is interrupted.

    Args:
        path (str): the file to write.
        write (callable): writes the whole content to the path it is given.
    """
    temporary = f'{path}.tmp'
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.unlink(temporary)


def write_whole_text(path, text):
    """``text`` (str) as the whole of the file ``path`` (:func:`write_whole`)."""
    def write(temporary):
        with open(temporary, 'w') as f:
            f.write(text)
    write_whole(path, write)
