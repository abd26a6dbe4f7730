"""Where each instance's password comes from, and the names a person sets.

The first of these wins: the env var named by ``password_env``, ``XAF_HUB_PW_<NAME>``,
``config.local.json`` beside the config file, ``password_file``. A password never lives in
``config.json`` (a literal one is refused). Redis's password comes from XAF_HUB_REDIS_PASSWORD.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from xaf_hub.config.reader import instances_list, load_json_file
from xaf_hub.errors import ConfigError


def pw_env_name(instance: str) -> str:
    """The conventional env var holding an instance's password: XAF_HUB_PW_<NAME>."""
    return "XAF_HUB_PW_" + re.sub(r"[-/.]", "_", instance.upper())


def password_var(instance: str, password_env: str = "") -> str:
    """The env var to set for an instance's password: its password_env, else the convention."""
    return password_env or pw_env_name(instance)


CREDENTIAL_KEYS = ("password", "password_env", "password_file", "password_key")


REDIS_PASSWORD_ENV = "XAF_HUB_REDIS_PASSWORD"


def local_overrides(raw: Any, file: Path) -> dict[str, dict[str, Any]]:
    """config.local.json's instances, keyed by name."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: top level must be an object")
    unknown = sorted(set(raw) - {"instances"})
    if unknown:
        raise ConfigError(
            f"{file}: key '{unknown[0]}': unknown key (config.local.json holds only 'instances')",
            "unknown_key",
        )
    items = instances_list(raw.get("instances", {}), file)
    return {obj["name"]: {k: v for k, v in obj.items() if k != "name"} for obj in items}


def resolve_password(
    obj: dict[str, Any], name: str, env: Mapping[str, str], file: Path, local_path: Path | None
) -> tuple[str | None, str]:
    """Apply the credential order; return (password, where it came from)."""
    var = obj.get("password_env")
    if isinstance(var, str) and var and env.get(var):
        return env[var], f"env:{var}"
    conventional = pw_env_name(name)
    if env.get(conventional):
        return env[conventional], f"env:{conventional}"
    if isinstance(obj.get("_local_password"), str) and obj["_local_password"]:
        return obj["_local_password"], f"local:{local_path}"
    pw_file = obj.get("password_file")
    if isinstance(pw_file, str) and pw_file:
        key = obj.get("password_key") or "password"
        path = Path(pw_file).expanduser()
        data = load_json_file(path, what="password")
        if not isinstance(data, dict) or not isinstance(data.get(key), str):
            raise ConfigError(
                f"{path}: key '{key}': expected a string password for instance '{name}'",
                "password_value",
            )
        return data[key], f"file:{path}"
    return None, "none"
