"""What in a task text points at one session (core.cues): files named, words that refer back.

Labelled both ways: what must count and what must not (generic file names, product names written
in camel case, words that look back in new work too)."""

from __future__ import annotations

import time

import pytest

from xaf_hub.core.cues import files_in, named_files, names, refers_back


@pytest.mark.parametrize(
    ("text", "files", "tasks", "expected"),
    [
        ("server/upload.go accepts any file", ["server/upload.go"], [], ("server/upload.go",)),
        ("queue.ts needs an op id", ["src/cart/queue.ts"], [], ("src/cart/queue.ts",)),
        ("在queue.ts里加一个 op id", ["src/cart/queue.ts"], [], ("src/cart/queue.ts",)),
        ("ｑｕｅｕｅ．ｔｓ 要加 op id", ["src/cart/queue.ts"], [], ("src/cart/queue.ts",)),
        ("pls write the downgrade() for 0042_order_uuid", ["migrations/0042_order_uuid.py"], [],
         ("migrations/0042_order_uuid.py",)),
        ("ImagePaste should take webp too", ["editor/ImagePaste.ts"], [],
         ("editor/ImagePaste.ts",)),
        ("pg_backup.sh ignores the exit code", [], ["写一个 pg_backup.sh 每天备份"],
         ("pg_backup.sh",)),
        ("C:\\work\\api\\ratelimit.py fails open", ["api/ratelimit.py"], [], ("api/ratelimit.py",)),
        # One file known twice (changed, and named in a task) is named once.
        ("fix queue.ts", ["src/cart/queue.ts"], ["edit queue.ts"], ("src/cart/queue.ts",)),
        # Not a name of this session's files:
        ("the store is out of sync", ["web/src/checkout/store.ts"], [], ()),  # a word, not store.ts
        ("bump the version in package.json", ["web/package.json"], [], ()),  # every project's
        ("move the setting to settings.py", ["shop/settings.py"], [], ()),
        ("ClickHouse TTL of 180 days", ["etl/pg_to_ch.py"], ["sync orders to ClickHouse"], ()),
        ("Node.js 22 upgrade", ["web/src/index.ts"], [], ()),
        ("upgrade to v2.3 of the SDK", ["sdk/v2.py"], [], ()),
        ("fix the upload", ["server/upload.go"], [], ()),
    ],
)
def test_named_files(
    text: str, files: list[str], tasks: list[str], expected: tuple[str, ...]
) -> None:
    assert named_files(text, tasks, files) == expected


def test_only_names_with_a_file_extension_are_files() -> None:
    text = (
        "Put a CDN in front, e.g. Cloudflare for myshop.com (i.e. api.myshop.com too); upgrade "
        "Next.js and Node.js, see django.utils and locator.click; at 10 a.m. p.s. nothing"
    )
    # Was: ['e.g', 'myshop.com', 'i.e', 'api.myshop.com', 'Next.js', 'Node.js', 'django.utils',
    # 'locator.click', 'a.m', 'p.s'].
    assert files_in([text]) == []
    assert names(text) == set()
    assert files_in(["fix web/next.js and queue.ts, then CONTRIBUTING.md"]) == [
        "web/next.js", "queue.ts", "CONTRIBUTING.md"
    ]
    # A task that named a site or a product names no file of the session's.
    assert named_files("deploy it to myshop.com", ["point DNS for myshop.com"]) == ()
    assert named_files("Next.js 15 breaks the build", ["upgrade to Next.js 14"]) == ()


def test_extensions_longer_than_five_letters_are_files_too() -> None:
    # Were cut at five letters: none of these was found.
    assert files_in([
        "prisma/schema.prisma, web/src/Cart.svelte, app/build.gradle, application.properties"
    ]) == [
        "prisma/schema.prisma", "web/src/Cart.svelte", "app/build.gradle",
        "application.properties",
    ]
    assert named_files("schema.prisma lacks an index", [], ["prisma/schema.prisma"]) == (
        "prisma/schema.prisma",
    )


@pytest.mark.parametrize(
    ("text", "files", "tasks", "expected"),
    [
        # Another folder: another file (was: named, by its last segment alone).
        ("src/a/queue.ts needs an op id", ["src/b/queue.ts"], [], ()),
        ("fix src/a/queue.ts", [], ["edit src/b/queue.ts"], ()),
        ("src/a/queue_job.py fails", ["src/b/queue_job.ts"], [], ()),
        # The folders both give agree, counted from the file up.
        ("a/queue.ts needs an op id", ["src/b/queue.ts", "web/src/a/queue.ts"], [],
         ("web/src/a/queue.ts",)),
        ("web/src/a/queue.ts needs an op id", ["src/a/queue.ts"], [], ("src/a/queue.ts",)),
        ("./src/A/queue.ts needs an op id", ["/srv/x/src/a/queue.ts"], [],
         ("/srv/x/src/a/queue.ts",)),
        # A bare name, on either side, is in any folder.
        ("queue.ts needs an op id", ["src/b/queue.ts"], [], ("src/b/queue.ts",)),
        ("src/a/queue.ts needs an op id", [], ["edit queue.ts"], ("queue.ts",)),
    ],
)
def test_a_name_written_with_folders_names_a_file_in_those_folders(
    text: str, files: list[str], tasks: list[str], expected: tuple[str, ...]
) -> None:
    assert named_files(text, tasks, files) == expected


def test_names_are_compared_by_their_last_segment_and_lower_case() -> None:
    assert {"steps.tsx", "steps"} <= names("web/src/checkout/Steps.tsx looks good")
    assert "offlinesync" in names("offlineSync drops failed ops")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Also do Android App Links for the same URLs", "also"),
        ("Same crash on Android 14 when the user comes back", "same"),
        ("Django 5: fix those warnings too while you're in there", "too"),
        ("the export still breaks on Excel", "still"),
        ("use IP + user agent instead", "instead"),
        ("冷启动现在 2.6 秒，还差一点", "现在"),
        ("ETL 顺便把 order_items 也同步过去", "顺便"),
        ("失败的操作应该留在队列里下次再试", "再"),
        # New work: nothing that looks back.
        ("Add a FAQ page to the marketing site", ""),
        ("Add in-app review prompts after the third completed order", ""),
        ("The Android APK is 85MB now, can we get the size down?", ""),
        ("页面底部加上 ICP 备案号和公安备案图标", ""),
        ("the stillness theme: a calm palette", ""),  # a word that starts like one is not one
    ],
)
def test_refers_back(text: str, expected: str) -> None:
    assert refers_back(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "把数据库还原到昨天的备份",  # restore
        "加一个退还押金的接口",  # give back
        "图书归还功能",
        "偿还贷款的计划表",  # repay
        "还款提醒短信",
        "用户还钱后更新订单状态",
        "也许可以用 Redis 做缓存",  # perhaps
        "退出登录时显示再见页面",  # goodbye
    ],
)
def test_a_chinese_word_that_only_holds_a_cue_character_is_no_cue(text: str) -> None:
    # Was: 还, 也 or 再 found inside the word.
    assert refers_back(text) == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('Add an "Also bought" row to the product page', ""),
        ("Rename the 'Buy again' button to 'Reorder'", ""),
        ("Rename 'the user’s cart again' to 'Basket'", ""),  # an apostrophe inside is none
        ("Add a “Still interested?” email after three days", ""),
        ("首页加一个「猜你还喜欢」模块", ""),
        ("首页加一个『猜你也喜欢』模块", ""),
        ("Log `retrying again` on each retry", ""),
        ("Add a README section:\n```\nmake test again\n```\nfor contributors", ""),
        # Outside the quote it is one; an apostrophe or an inch mark opens no quote.
        ('the "Also bought" row is still empty', "still"),
        ("the export doesn't work, it's still broken", "still"),
        ("the users' carts are still empty", "still"),
        ('a 5" screen still cuts the footer', "still"),
    ],
)
def test_a_cue_inside_quotes_or_code_is_no_cue(text: str, expected: str) -> None:
    # Was: the quoted word (also, again, still, 还, 也) taken as referring back.
    assert refers_back(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Add same-day delivery to the checkout", ""),
        ("Show an also-ran badge on the leaderboard", ""),
        ("A same-origin check for the webhook", ""),
        ("Add a one-time-too-many warning", ""),
        ("Offer same\u2011day shipping", ""),  # a non-breaking hyphen
        # A cue beside a compound, or before a dash set off by spaces, is one.
        ("same-day delivery still shows the old fee", "still"),
        ("the same - nothing changed", "same"),
    ],
)
def test_a_cue_inside_a_hyphenated_compound_is_no_cue(text: str, expected: str) -> None:
    # Was: "same" of same-day, "also" of also-ran found as words that refer back.
    assert refers_back(text) == expected


# -- what a hostile text costs ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "_" * 100_000 + ".",  # an identifier that a dot ends: "\w*_\w+" tried every underscore
        "a_" * 50_000 + ".",
        "a_" * 50_000 + "-x.py",  # a file whose stem is nearly code-shaped
        "a" * 100_000,
        "." * 100_000,
        "/" * 100_000,
        "-" * 100_000,
        "a.b-c/" * 16_000,
        "aA" * 50_000 + ".",
        " 'a" * 33_000,  # quotes that never close
        "\u201ca" * 50_000,
        "`" * 100_000,
    ],
    ids=lambda t: repr(t[:4]),
)
def test_a_100_kb_text_without_spaces_is_read_in_linear_time(text: str) -> None:
    # Was quadratic: 10 kB of "_" and a dot took 0.75 s, 100 kB about two minutes.
    started = time.perf_counter()
    names(text)
    files_in([text])
    named_files(text, [text], [text, "src/a_b.py"])
    refers_back(text)
    assert time.perf_counter() - started < 5
