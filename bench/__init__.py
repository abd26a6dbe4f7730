"""Performance benchmark of xaf-hub against real opencode servers (run: ``python -m bench``).

Not a test: it starts K real servers with M project sessions each, times whole hub commands
against the floor (the same HTTP requests issued by a minimal httpx script), and writes
``bench/results/latest.json``. This module holds the pure workload generator that both the
fleet seeding and the matcher probe use, so their sessions look alike.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

# Sub-projects of a mid-sized product repository; `.worktrees/task-NNN` folders are added in
# proportion to the session count (a busy fleet leaves one worktree per branch of work).
PROJECT_SUBDIRS = (
    "", "web", "web/src/pages", "web/src/components", "api", "api/orders", "api/payments",
    "admin", "gateway", "deploy", "docs", "mobile", "scripts",
)
# Directories that are not the project's: scratch space, another repo, an excluded tool folder.
OUTSIDE_SUBDIRS = (
    "scratch", "home/alice/workbuddy/notes", "other-repo", "other-repo/api", "downloads",
)
EXCLUDE_SUBSTRING = "workbuddy"

_ZH_VERBS = ("修复", "优化", "重构", "新增", "补充", "升级", "排查", "迁移", "拆分", "简化")
_ZH_OBJECTS = (
    "登录页样式", "订单导出 CSV 乱码", "支付回调", "首页性能", "用户头像上传失败", "商品搜索排序",
    "权限管理页面角色筛选", "单元测试", "接口文档", "API 网关 502 错误", "缓存策略", "消息推送",
    "优惠券发放", "库存同步", "报表统计", "退款流程", "发票 PDF 排版", "短信验证码", "购物车合并",
    "会员等级", "物流轨迹", "评论审核", "定时任务", "数据库连接池",
)
_EN_VERBS = (
    "Fix", "Refactor", "Add", "Update", "Migrate", "Investigate", "Speed up", "Document",
    "Remove", "Rework",
)
_EN_OBJECTS = (
    "login page styles", "order export CSV encoding", "payment callback handler",
    "flaky e2e test in checkout flow", "user avatar upload", "search ranking",
    "role filter on admin page", "README install steps", "Dockerfile build cache",
    "i18n for settings page", "rate limiter", "webhook retries", "session timeout",
    "invoice PDF layout", "coupon expiry job", "inventory sync", "refund state machine",
    "SMS verification code", "cart merge on login", "membership tiers", "shipment tracking",
    "comment moderation queue", "cron scheduler", "database connection pool",
)
_SUFFIXES = ("", "", "", " (#{n})", " v2.{n}", " — follow-up", " in {area}", "：{area} 模块")

DISPATCH_TEXT = "修复登录页样式：窄屏下登录按钮错位"


@dataclass(frozen=True)
class SessionSpec:
    """One session to create: where and under which title."""

    directory: str
    title: str


def project_dirs(root: str, m: int) -> list[str]:
    """The project directories of one server holding ``m`` project sessions."""
    base = root.rstrip("/")
    dirs = [f"{base}/{sub}" if sub else base for sub in PROJECT_SUBDIRS]
    dirs += [f"{base}/.worktrees/task-{i:03d}" for i in range(max(1, m // 50))]
    return dirs


def outside_dirs(root: str) -> list[str]:
    """Directories outside the project (under ``root``, which is not a project root)."""
    base = root.rstrip("/")
    return [f"{base}/{sub}" for sub in OUTSIDE_SUBDIRS]


def title(rng: random.Random, area: str) -> str:
    """One realistic task title: Chinese or English, sometimes untitled (opencode's placeholder)."""
    roll = rng.random()
    if roll < 0.08:
        day = f"2025-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}"
        clock = f"0{rng.randint(0, 9)}:{rng.randint(10, 59)}:{rng.randint(10, 59)}"
        return f"New session - {day}T{clock}.{rng.randint(100, 999)}Z"
    suffix = rng.choice(_SUFFIXES).format(n=rng.randint(2, 4000), area=area or "core")
    if roll < 0.55:
        return f"{rng.choice(_ZH_VERBS)}{rng.choice(_ZH_OBJECTS)}{suffix}"
    return f"{rng.choice(_EN_VERBS)} {rng.choice(_EN_OBJECTS)}{suffix}"


def sessions_for_server(
    project_root: str, outside_root: str, m: int, seed: int
) -> list[SessionSpec]:
    """``m`` project sessions over the project's directories plus ``m // 10`` outside it."""
    rng = random.Random(seed)
    inside = project_dirs(project_root, m)
    # Skewed like a real repository: the first few sub-projects get most of the work.
    weights = [1.0 / (1 + i) ** 0.7 for i in range(len(inside))]
    specs = []
    for d in rng.choices(inside, weights=weights, k=m):
        area = d.rsplit("/", 1)[-1]
        specs.append(SessionSpec(d, title(rng, area)))
    outside = outside_dirs(outside_root)
    specs += [SessionSpec(d, title(rng, "")) for d in rng.choices(outside, k=m // 10)]
    rng.shuffle(specs)
    return specs


def matcher_documents(n: int, seed: int = 7) -> list[tuple[str, str]]:
    """``n`` (title, directory) pairs spread like a fleet's project sessions."""
    rng = random.Random(seed)
    dirs: Sequence[str] = project_dirs("/srv/shop", max(n // 6, 1))
    out = []
    for _ in range(n):
        d = rng.choice(dirs)
        out.append((title(rng, d.rsplit("/", 1)[-1]), d))
    return out
