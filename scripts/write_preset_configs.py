"""Write (or, with ``--check``, compare) each built-in preset's ``config.json``: ``zoo.build(name).to_json()``.

The config is the architecture alone (the registry's entry through ``zoo.build``), never read from the weights, so
re-training a preset does not change it. ``tests/test_preset_format.py`` checks the shipped files equal what
``zoo.build`` gives, so the two cannot drift: after an edit to the registry or a builder, run

    python scripts/write_preset_configs.py [NAME ...]

``--check`` writes nothing and exits 1 listing the files that differ.
"""
import argparse
import json
import os
import sys

import zoo
from zoo.loading import CONFIG_FILE, preset_dir


def preset_config(name):
    """The ``config.json`` text preset ``name`` ships (pretty-printed, keys sorted, one newline at the end)."""
    return json.dumps(json.loads(zoo.build(name).to_json()), indent=1, sort_keys=True) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="presets (default: all)")
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when a file differs")
    args = parser.parse_args(argv)
    stale = []
    for name in args.names or zoo.list_models():
        path = os.path.join(preset_dir(name), CONFIG_FILE)
        text = preset_config(name)
        current = open(path).read() if os.path.isfile(path) else None
        if current == text:
            continue
        stale.append(path)
        if not args.check:
            with open(path, "w") as handle:
                handle.write(text)
            print(f"wrote {path}")
    if args.check and stale:
        print("stale: " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
