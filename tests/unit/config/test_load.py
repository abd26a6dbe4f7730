"""Config loading, validation and credential resolution (SPEC §3)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from xaf_hub.config.credentials import pw_env_name
from xaf_hub.config.load import UNCONTAINED, MatchRule, load_config
from xaf_hub.core.commits import RUNNER_CONFIG, locked_paths
from xaf_hub.errors import ConfigError


def write(path: Path, data: Any) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def base(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "project": {"name": "demo", "fallback_segments": ["demo"]},
        "instances": [{"name": "local-a", "url": "http://127.0.0.1:4096", "roots": ["/srv/demo"]}],
    }
    doc.update(extra)
    return doc


def test_lookup_order(tmp_path: Path, _isolated_home: Path) -> None:
    a = write(tmp_path / "a.json", base())
    b = write(tmp_path / "b.json", base(project={"name": "from-env"}))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    write(cwd / "config.json", base(project={"name": "from-cwd"}))
    write(_isolated_home / "config.json", base(project={"name": "from-home"}))
    env = {"XAF_HUB_HOME": str(_isolated_home), "XAF_HUB_CONFIG": str(b)}
    assert load_config(str(a), env=env, cwd=cwd).project_name == "demo"
    assert load_config(None, env=env, cwd=cwd).project_name == "from-env"
    env.pop("XAF_HUB_CONFIG")
    assert load_config(None, env=env, cwd=cwd).project_name == "from-cwd"
    (cwd / "config.json").unlink()
    assert load_config(None, env=env, cwd=cwd).project_name == "from-home"
    (_isolated_home / "config.json").unlink()
    with pytest.raises(ConfigError, match="no config found"):
        load_config(None, env=env, cwd=cwd)


def test_defaults(tmp_path: Path) -> None:
    cfg = load_config(str(write(tmp_path / "c.json", base())), env={}, cwd=tmp_path)
    inst = cfg.instances[0]
    assert (cfg.concurrency_limit, cfg.page_size, cfg.scan_workers, cfg.retries) == (2, 8000, 1, 1)
    rule = MatchRule(0.30, 0.10, 0.35, 0.15, 0.10, 0.05)
    assert (cfg.match, cfg.session_ttl_days) == (rule, 10.0)
    assert inst.branch_policy == "mainline"  # name starts with "local"
    assert inst.username == "opencode" and inst.password is None
    assert inst.rules.is_project("/srv/demo/x") and inst.rules.is_project("/elsewhere/demo")


@pytest.mark.parametrize(("count", "workers"), [(1, 1), (12, 12), (50, 50), (80, 64)])
def test_instances_are_scanned_all_at_once_up_to_a_bound(
    tmp_path: Path, count: int, workers: int
) -> None:
    doc = {"instances": [{"name": f"n{i}", "url": f"http://h{i}.test:4096"}
                         for i in range(count)]}
    cfg = load_config(str(write(tmp_path / "c.json", doc)), env={}, cwd=tmp_path)
    assert cfg.scan_workers == workers
    doc["scan_workers"] = 3
    cfg = load_config(str(write(tmp_path / "c.json", doc)), env={}, cwd=tmp_path)
    assert cfg.scan_workers == 3


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (base(colour="red"), "key 'colour': unknown key"),
        (base(concurency_limit=3), "did you mean 'concurrency_limit'"),
        (
            base(concurrency_limit="2"),
            "key 'concurrency_limit': expected a whole number, got a string",
        ),
        (base(concurrency_limit=0), "must be at least 1"),
        (base(auto_match="yes"), "key 'auto_match': expected a boolean"),
        (base(timeouts={"connect_seconds": True}), "timeouts.connect_seconds': expected a number"),
        (base(instances=[{"name": "a", "url": "ftp://x"}]), "must be an http:// or https:// URL"),
        (
            base(instances=[{"name": "a", "url": "http://u:p@127.0.0.1"}]),
            "must not carry credentials",
        ),
        (base(instances=[{"name": "a"}]), "instances[0].url': missing"),
        (base(instances=[{"name": " ", "url": "http://h"}]), "'instances[0].name': expected a"),
        (base(instances={"": {"url": "http://h"}}), "'instances[0].name': expected a non-empty"),
        (
            base(instances=[{"name": "a", "url": "http://127.0.0.1", "roots": ["rel/dir"]}]),
            "roots[0]': must be an absolute path",
        ),
        (
            base(
                instances=[
                    {"name": "a", "url": "http://127.0.0.1"},
                    {"name": "a", "url": "http://127.0.0.1:2"},
                ]
            ),
            "duplicate instance name 'a'",
        ),
        (
            base(instances=[{"name": "a", "url": "http://127.0.0.1", "password": "hunter2"}]),
            "a literal password does not belong",
        ),
        (
            base(instances=[{"name": "a", "url": "http://127.0.0.1", "branch_policy": "trunk"}]),
            "must be 'branch' or 'mainline'",
        ),
        (
            base(instances=[{"name": "a", "url": "http://127.0.0.1", "api": "v3"}]),
            "must be 'auto', 'classic' or 'v2'",
        ),
        (
            base(instances=[{"name": "a", "url": "http://127.0.0.1", "bogus": 1}]),
            "instances[0].bogus': unknown key",
        ),
        (base(models={"chain": ["no-slash"]}), "expected 'provider/model'"),
        (base(models={"timezone": "Mars/Olympus"}), "unknown time zone"),
        (base(instances="x"), "'instances': expected a list or an object"),
        ([1, 2], "top level must be an object"),
    ],
)
def test_validation_errors(tmp_path: Path, doc: Any, message: str) -> None:
    path = write(tmp_path / "config.json", doc)
    with pytest.raises(ConfigError) as err:
        load_config(str(path), env={}, cwd=tmp_path)
    assert message in str(err.value)
    assert str(path) in str(err.value)
    assert "hunter2" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"instances": [}', "line 1 column 16"),
        ('{\n  "a": 1,\n}', "line 3 column 1"),
        ("", "line 1 column 1"),
    ],
)
def test_invalid_json_reports_line_and_column(tmp_path: Path, text: str, where: str) -> None:
    path = write(tmp_path / "config.json", text)
    with pytest.raises(ConfigError, match=where):
        load_config(str(path), env={}, cwd=tmp_path)


def test_non_utf8_and_bom(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"project": {"name": "\xff"}}')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(str(bad), env={}, cwd=tmp_path)
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(base()).encode())
    assert load_config(str(bom), env={}, cwd=tmp_path).project_name == "demo"


def test_instances_as_map(tmp_path: Path) -> None:
    doc = base(
        instances={"lan-1": {"url": "http://127.0.0.1:1"}, "lan-2": {"url": "http://127.0.0.1:2"}}
    )
    cfg = load_config(str(write(tmp_path / "c.json", doc)), env={}, cwd=tmp_path)
    assert [i.name for i in cfg.instances] == ["lan-1", "lan-2"]
    assert cfg.instances[0].branch_policy == "branch"


def test_credential_order(tmp_path: Path) -> None:
    pwfile = write(tmp_path / "service.json", {"secret": "from-file"})
    inst = {
        "name": "lan-a.b",
        "url": "http://127.0.0.1:1",
        "password_env": "MY_PW",
        "password_file": str(pwfile),
        "password_key": "secret",
    }
    cfgpath = write(tmp_path / "config.json", base(instances=[inst]))
    write(tmp_path / "config.local.json", {"instances": {"lan-a.b": {"password": "from-local"}}})
    assert pw_env_name("lan-a.b") == "XAF_HUB_PW_LAN_A_B"
    env = {"MY_PW": "from-env", "XAF_HUB_PW_LAN_A_B": "from-conv"}
    got = lambda e: load_config(str(cfgpath), env=e, cwd=tmp_path).instances[0]  # noqa: E731
    assert (got(env).password, got(env).password_source) == ("from-env", "env:MY_PW")
    env.pop("MY_PW")
    assert got(env).password == "from-conv"
    env.pop("XAF_HUB_PW_LAN_A_B")
    assert got(env).password == "from-local" and got(env).password_source.startswith("local:")
    (tmp_path / "config.local.json").unlink()
    assert got(env).password == "from-file"
    assert "from-file" not in repr(got(env))


def test_local_list_form_and_overrides(tmp_path: Path) -> None:
    cfgpath = write(tmp_path / "config.json", base())
    write(
        tmp_path / "config.local.json",
        {"instances": [{"name": "local-a", "password": "pw", "concurrency_limit": 5}]},
    )
    inst = load_config(str(cfgpath), env={}, cwd=tmp_path).instances[0]
    assert inst.password == "pw" and inst.concurrency_limit == 5


def test_home_local_lends_only_credentials(tmp_path: Path, _isolated_home: Path) -> None:
    sub = tmp_path / "elsewhere"
    sub.mkdir()
    cfgpath = write(sub / "config.json", base())
    write(
        _isolated_home / "config.local.json",
        {
            "instances": {
                "local-a": {
                    "password": "lent",
                    "concurrency_limit": 9,
                    "url": "http://127.0.0.1:9",
                },
                "stranger": {"password": "x"},
            }
        },
    )
    cfg = load_config(str(cfgpath), env={"XAF_HUB_HOME": str(_isolated_home)}, cwd=tmp_path)
    assert [i.name for i in cfg.instances] == ["local-a"]  # never adds instances
    inst = cfg.instances[0]
    assert inst.password == "lent"
    assert inst.concurrency_limit == 2 and inst.url == "http://127.0.0.1:4096"
    assert cfg.local_scope == "home"


def test_bad_local_file(tmp_path: Path) -> None:
    cfgpath = write(tmp_path / "config.json", base())
    write(tmp_path / "config.local.json", '{"instances": {"local-a": {"password": ')
    with pytest.raises(ConfigError, match=r"config.local.json: invalid JSON at line 1"):
        load_config(str(cfgpath), env={}, cwd=tmp_path)


def test_example_config_is_valid() -> None:
    root = Path(__file__).resolve().parents[3]
    cfg = load_config(str(root / "config.example.json"), env={}, cwd=root)
    assert cfg.instances
    for inst in cfg.instances:
        assert inst.url.startswith(("http://127.0.0.1", "http://localhost"))


def test_page_language_setting(tmp_path: Path) -> None:
    from xaf_hub.config.load import parse_config

    where = tmp_path / "config.json"
    assert parse_config({}, path=where, env={}).page_language == "auto"
    for value in ("auto", "en", "zh"):
        cfg = parse_config({"page": {"language": value}}, path=where, env={})
        assert cfg.page_language == value
    with pytest.raises(ConfigError, match=r"page.language.*auto, en or zh"):
        parse_config({"page": {"language": "fr"}}, path=where, env={})
    with pytest.raises(ConfigError, match=r"page.colour.*unknown key"):
        parse_config({"page": {"colour": "blue"}}, path=where, env={})


def test_page_section_is_shared_with_notifications(tmp_path: Path) -> None:
    from xaf_hub.config.load import parse_config

    for tag, lang in (("zh", "zh"), ("zh-CN", "zh"), ("zh_TW", "zh"), ("en-US", "en")):
        doc = {"page": {"language": tag, "url": "https://hub.example.internal/"}}
        cfg = parse_config(doc, path=tmp_path / "config.json", env={})
        assert cfg.page_language == lang
        assert cfg.notify.language == lang  # notifications speak the page's language


def test_project_repository(tmp_path: Path) -> None:
    """project.repository / commit_url: a relative path is the config's; a token is a secret."""
    (tmp_path / "cfg").mkdir()
    doc = base(project={"name": "shop", "repository": "../origin.git"})
    cfg = load_config(write(tmp_path / "cfg" / "config.json", doc))
    assert cfg.repository.url == str((tmp_path / "origin.git").resolve())
    assert cfg.repository.commit_url == "" and cfg.repository.fetch_timeout_seconds == 60
    assert load_config(write(tmp_path / "config.json", base())).repository.url == ""
    token = "ghp_tok3nValue"
    for url, secrets in (
        (f"https://user:{token}@git.example/shop.git", (token, f"user:{token}")),
        (f"https://{token}@git.example/shop.git", (token,)),
        ("ssh://git@git.example/shop.git", ()),  # a user name, no secret
        ("git@git.example:shop.git", ()),
    ):
        doc = base(project={"name": "shop", "repository": url})
        cfg = load_config(write(tmp_path / "config.json", doc))
        assert cfg.repository.url == url  # a URL, not a path: kept as written
        assert set(secrets) <= set(cfg.secrets()) and cfg.repository.secrets() == secrets


def test_project_checks_of_done_work(tmp_path: Path) -> None:
    """check_command, its bound and retries, locked_paths: defaults, then as written."""
    doc = base(project={"name": "shop", "repository": "/srv/origin.git"})
    repo = load_config(write(tmp_path / "config.json", doc)).repository
    assert (repo.check_command, repo.check_timeout_seconds, repo.check_retries) == ("", 600, 1)
    assert repo.locked_paths == ()
    doc["project"].update(
        check_command=" make test ",
        check_timeout_seconds=30,
        check_retries=0,
        locked_paths=["tests/**", " .ci/** "],
    )
    repo = load_config(write(tmp_path / "config.json", doc)).repository
    assert (repo.check_command, repo.check_timeout_seconds, repo.check_retries) == (
        "make test",
        30,
        0,
    )
    assert repo.locked_paths == ("tests/**", ".ci/**")


def test_the_test_runners_configuration_is_locked_by_default(tmp_path: Path) -> None:
    doc = base(project={"name": "shop", "repository": "/srv/origin.git", "locked_paths": ["t/**"]})
    repo = load_config(write(tmp_path / "config.json", doc)).repository
    assert repo.locked_defaults and repo.locked == ("t/**", *RUNNER_CONFIG)
    changed = ["GNUmakefile", "lib/conftest.py", "package.json", ".github/workflows/ci.yml",
               "pyproject.toml", "sub/Makefile", "t/test_a.py", "src/app.py", "docs/make.md"]
    assert locked_paths(changed, repo.locked) == tuple(changed[:7])
    doc["project"]["locked_defaults"] = False  # the project names its own list
    repo = load_config(write(tmp_path / "config.json", doc)).repository
    assert repo.locked == ("t/**",)


def test_the_check_reaches_what_the_config_names(tmp_path: Path) -> None:
    doc = base(project={"name": "shop", "repository": "/srv/origin.git"})
    repo = load_config(write(tmp_path / "config.json", doc)).repository
    assert (repo.check_paths, repo.check_network, repo.check_uncontained) == ((), False, "")
    doc["project"].update(
        check_paths=["/opt/jdk"], check_network=True, check_uncontained=UNCONTAINED
    )
    repo = load_config(write(tmp_path / "config.json", doc)).repository
    assert (repo.check_paths, repo.check_network) == (("/opt/jdk",), True)
    assert repo.check_uncontained == UNCONTAINED


@pytest.mark.parametrize(
    ("project", "message"),
    [
        ({"repository": 3}, "key 'project.repository': expected a string"),
        ({"repository": "--upload-pack=x"}, "key 'project.repository': must be a git URL"),
        ({"commit_url": "ftp://x/{commit}"}, "'project.commit_url': must be an http:// or https://"),
        ({"commit_url": "https://git.example/c/"}, "must hold {commit} where the hash goes"),
        ({"fetch_timeout_seconds": 0}, "key 'project.fetch_timeout_seconds': must be at least 1"),
        ({"repository": "/o.git", "check_command": 7}, "key 'project.check_command': expected"),
        ({"repository": "/o.git", "check_command": "  "}, "'project.check_command': must not be"),
        ({"check_command": "make test"}, "'project.check_command': needs project.repository"),
        ({"locked_paths": ["tests/**"]}, "'project.locked_paths': needs project.repository"),
        ({"repository": "/o.git", "check_timeout_seconds": 0}, "check_timeout_seconds': must be"),
        ({"repository": "/o.git", "check_retries": -1}, "'project.check_retries': must be at"),
        ({"repository": "/o.git", "check_retries": 1.5}, "'project.check_retries': expected"),
        ({"repository": "/o.git", "locked_paths": "tests/**"}, "'project.locked_paths': expected"),
        ({"repository": "/o.git", "locked_paths": [""]}, "'project.locked_paths[0]': must not"),
        ({"repository": "/o.git", "locked_paths": ["a", 3]}, "'project.locked_paths[1]': expected"),
        ({"repository": "/o.git", "locked_paths": ["/etc/*"]}, "locked_paths[0]': must be relat"),
        ({"repository": "/o.git", "locked_paths": ["a/../b"]}, "locked_paths[0]': must not climb"),
        ({"repository": "/o.git", "check_uncontained": "yes"},
         f"'project.check_uncontained': must be exactly {UNCONTAINED!r}"),
        ({"repository": "/o.git", "check_uncontained": True}, "check_uncontained': expected"),
        ({"repository": "/o.git", "check_paths": ["opt/jdk"]}, "check_paths[0]': must be an abs"),
        ({"repository": "/o.git", "locked_defaults": "no"}, "'project.locked_defaults': expected"),
    ],
)
def test_project_repository_errors(tmp_path: Path, project: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(write(tmp_path / "config.json", base(project={"name": "p", **project})))


def test_budgets_read_and_default_to_no_ceiling(tmp_path: Path) -> None:
    cfg = load_config(str(write(tmp_path / "c.json", base())), env={}, cwd=tmp_path)
    assert cfg.budget.daily_usd is None and cfg.instances[0].budget_daily_usd is None
    doc = base(budget={"daily_usd": 3})
    doc["instances"][0]["budget_daily_usd"] = 0.5
    cfg = load_config(str(write(tmp_path / "c.json", doc)), env={}, cwd=tmp_path)
    assert cfg.budget.daily_usd == 3.0 and isinstance(cfg.budget.daily_usd, float)
    assert cfg.instances[0].budget_daily_usd == 0.5


def _with_instance_budget(value: Any) -> dict[str, Any]:
    doc = base()
    doc["instances"][0]["budget_daily_usd"] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (base(budget=3), "key 'budget': expected an object, got a number"),
        (base(budget={"daily_usd": "3"}), "key 'budget.daily_usd': expected a number, got a str"),
        (base(budget={"daily_usd": True}), "key 'budget.daily_usd': expected a number, got a bool"),
        (base(budget={"daily_usd": -1}), "key 'budget.daily_usd': must be an amount of US dollars"),
        (base(budget={"daily_us": 3}), "key 'budget.daily_us': unknown key.*daily_usd"),
        (
            _with_instance_budget(-0.01),
            r"key 'instances\[0\].budget_daily_usd': must be an amount of US dollars",
        ),
        (
            _with_instance_budget([1]),
            r"key 'instances\[0\].budget_daily_usd': expected a number, got a list",
        ),
    ],
)
def test_bad_budgets_are_named(tmp_path: Path, doc: dict[str, Any], message: str) -> None:
    path = write(tmp_path / "c.json", doc)
    with pytest.raises(ConfigError, match=message):
        load_config(str(path), env={}, cwd=tmp_path)


def test_a_nan_budget_is_refused(tmp_path: Path) -> None:
    # Python's JSON reader accepts NaN and Infinity: a ceiling must still be a real amount.
    text = json.dumps(base(budget={"daily_usd": 1})).replace('"daily_usd": 1', '"daily_usd": NaN')
    path = write(tmp_path / "c.json", text)
    with pytest.raises(ConfigError, match="budget.daily_usd': must be an amount of US dollars"):
        load_config(str(path), env={}, cwd=tmp_path)


def test_permissions_read_in_order_and_default_to_nothing(tmp_path: Path) -> None:
    cfg = load_config(str(write(tmp_path / "c.json", base())), env={}, cwd=tmp_path)
    assert cfg.permissions.rules == () and cfg.permissions.deny_after_minutes is None
    doc = base(permissions={
        "rules": [{"kind": "bash", "pattern": "git status*", "action": "allow"},
                  {"kind": "*", "action": "deny"}],
        "deny_after_minutes": 30,
    })
    cfg = load_config(str(write(tmp_path / "c.json", doc)), env={}, cwd=tmp_path)
    assert [(r.kind, r.pattern, r.action) for r in cfg.permissions.rules] == [
        ("bash", "git status*", "allow"), ("*", "*", "deny")
    ]
    assert cfg.permissions.deny_after_minutes == 30.0


@pytest.mark.parametrize(
    ("permissions", "message"),
    [
        ({"rules": {}}, r"key 'permissions.rules': expected a list"),
        ({"rules": [3]}, r"permissions.rules\[0\] must be an object"),
        ({"rules": [{"kind": "bash", "action": "ask"}]},
         r"key 'permissions.rules\[0\].action': must be allow or deny, got 'ask'"),
        ({"rules": [{"action": "allow"}]}, r"key 'permissions.rules\[0\].kind': must name"),
        ({"rules": [{"kind": "bash", "action": "allow", "patern": "x"}]},
         r"key 'permissions.rules\[0\].patern': unknown key.*pattern"),
        ({"deny_after_minutes": 0}, r"key 'permissions.deny_after_minutes': must be more than 0"),
        ({"deny_after": 5}, r"key 'permissions.deny_after': unknown key"),
    ],
)
def test_bad_permissions_are_named(
    tmp_path: Path, permissions: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path / "c.json", base(permissions=permissions)))


@pytest.mark.parametrize(
    ("extra", "key", "url"),
    [
        ({"project": {"name": "d", "commit_url": "ftp://x/{commit}"}}, "project.commit_url",
         "ftp://x/{commit}"),
        ({"page": {"url": "ftp://x/"}}, "page.url", "ftp://x/"),
        ({"instances": [{"name": "a", "url": "ftp://x"}]}, "instances[0].url", "ftp://x"),
    ],
)
def test_every_http_url_key_is_refused_in_the_same_words(
    tmp_path: Path, extra: dict[str, Any], key: str, url: str
) -> None:
    """The commit link, the page's address and an instance's URL are checked by one rule."""
    with pytest.raises(ConfigError) as got:
        load_config(str(write(tmp_path / "c.json", base(**extra))), env={}, cwd=tmp_path)
    assert str(got.value).endswith(f"key '{key}': must be an http:// or https:// URL, got {url!r}")
    assert got.value.problem == "bad_url"
