"""Install or remove the startup hook (``tf_amp_autoenable.pth``) in site-packages by hand.

A regular or wheel install of tf_amp ships the ``.pth`` (setup.py copies it into the wheel's
root). Editable installs and unusual layouts may not; this puts it where Python's ``site``
module reads ``.pth`` files::

    python -m tf_amp.runtime.hook_install            # install into purelib site-packages
    python -m tf_amp.runtime.hook_install --remove   # remove it
    python -m tf_amp.runtime.hook_install --print    # show where it is / would go

The hook does nothing unless a TF_ENABLE_AUTO_MIXED_PRECISION* variable is set.
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig

PTH_NAME = "tf_amp_autoenable.pth"


def source_path() -> str:
    """The ``.pth`` shipped inside the package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), PTH_NAME)


def pth_text() -> str:
    """The hook's one line, from the copy shipped as package data (pyproject.toml)."""
    with open(source_path(), encoding="utf-8") as f:
        return f.read()


def target_path(site_dir: str | None = None) -> str:
    return os.path.join(site_dir or sysconfig.get_paths()["purelib"], PTH_NAME)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tf_amp.runtime.hook_install")
    parser.add_argument("--remove", action="store_true", help="remove the hook")
    parser.add_argument("--print", action="store_true", help="only print the target path")
    parser.add_argument("--site-dir", help="site-packages directory (default: purelib)")
    args = parser.parse_args(argv)
    target = target_path(args.site_dir)
    if args.print:
        print(f"{target} ({'installed' if os.path.exists(target) else 'not installed'})")
    elif args.remove:
        if os.path.exists(target):
            os.remove(target)
        print(f"removed {target}")
    else:
        with open(target, "w", encoding="utf-8") as f:
            f.write(pth_text())
        print(f"installed {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
