"""Print the requirements of pyproject.toml's project with some of its extras, one a line.

The images install these before they copy the sources, so that the layer with the
dependencies is kept while only the code changes:

    python requirements.py pyproject.toml server s3 > requirements.txt

An extra that names the project itself (``rlreplay[server]``) is followed. The build
system's requirements (setuptools, wheel) come first: the package itself is then installed
with ``--no-build-isolation --no-deps``, needing no index.
"""

from __future__ import annotations

import re
import sys
import tomllib


def requirements(pyproject: str, extras: list[str]) -> list[str]:
    with open(pyproject, "rb") as f:
        data = tomllib.load(f)
    project = data["project"]
    name = project["name"]
    optional = project.get("optional-dependencies", {})
    wanted = [*data.get("build-system", {}).get("requires", []), *project.get("dependencies", [])]
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(f"pyproject.toml has no extra {extra!r}")
        seen.add(extra)
        for requirement in optional[extra]:
            self_ref = re.fullmatch(rf"{re.escape(name)}\[([\w,\s-]+)\]", requirement.strip())
            if self_ref:
                todo.extend(part.strip() for part in self_ref[1].split(","))
            else:
                wanted.append(requirement)
    return list(dict.fromkeys(wanted))


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1], sys.argv[2:])))
