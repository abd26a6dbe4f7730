"""Every word the hub says to people, in English and Chinese, in one catalogue (pure).

A key maps to its (English, Chinese) words; ``text(lang, key, **values)`` fills ``{name}``
placeholders. The page (``page.words``), the chat (``notify.messages``), the words of a run's
outcome and a task's state (``core.outcomes``) and the config notes all read from here, so a
word is written and translated once.
"""

from __future__ import annotations

from typing import Literal

Lang = Literal["en", "zh"]
LANGS: tuple[Lang, ...] = ("en", "zh")

# key -> (English, Chinese). Keep the wording plain: the readers are not programmers.
TEXT: dict[str, tuple[str, str]] = {
    # page frame
    "page.title": ("{title} · AI coding sessions", "{title} · AI 编程会话"),
    "page.intro": (
        "What the team's AI coding assistants are doing for this project, server by server.",
        "团队的 AI 编程助手正在为这个项目做什么，按服务器列出。",
    ),
    "page.intro_projects": (
        "What the team's AI coding assistants are doing for each of its projects, server by "
        "server.",
        "团队的 AI 编程助手正在为各个项目做什么，按服务器列出。",
    ),
    # one line per project when the page shows several
    "projects.title": ("Projects", "项目"),
    "projects.item": (
        "{sessions} sessions · {running} running", "{sessions} 个会话 · {running} 个运行中"
    ),
    "projects.other": ("other", "其他"),
    "projects.other_hint": (
        "Sessions in folders of no configured project",
        "不属于任何已配置项目的文件夹中的会话",
    ),
    "projects.all": ("All projects", "全部项目"),
    "projects.hint": (
        "Choose a project to show only its sessions.",
        "选择一个项目，只显示它的会话。",
    ),
    "page.data_from": ("Data from {exact} ({when}).", "数据时间：{exact}（{when}）。"),
    "page.source_live": ("Source: live, {age} s old.", "来源：实时，{age} 秒前确认。"),
    "page.source_mixed": (
        "Source: live for {names} ({age} s old), the rest scanned.",
        "来源：{names} 为实时（{age} 秒前确认），其余为刚才的扫描。",
    ),
    "page.static": (
        "This page is a saved snapshot: the times stay current, the data does not.",
        "这是一份保存下来的快照：时间会自动更新，数据不会。",
    ),
    "page.live": (
        "This page updates by itself when something changes (at least every {seconds} "
        "seconds).",
        "本页在有变化时自动更新（至少每 {seconds} 秒一次）。",
    ),
    "page.following": ("Following live.", "正在实时跟踪。"),
    "page.updated_ago": ("Updated {seconds} s ago.", "{seconds} 秒前已更新。"),
    "page.updated_now": ("Updated just now.", "刚刚已更新。"),
    "page.lost_hub": (
        "The page cannot reach the hub right now; it shows what it last received and keeps "
        "trying.",
        "本页暂时连不上汇总服务，显示的是最后一次收到的数据，会继续重试。",
    ),
    "page.fleet_down": (
        "No server answered the last check: the figures below are empty, not zero work.",
        "上次检查时没有任何服务器应答：下面的数字是空的，并不代表没有工作。",
    ),
    # top summary of servers that did not answer
    "down.head": (
        "{count} of {servers} servers did not answer:",
        "{servers} 台服务器中有 {count} 台没有应答：",
    ),
    "down.item": ("{name}: {reason}", "{name}：{reason}"),
    # cards
    "cards.aria": ("Summary", "概况"),
    "cards.healthy": ("Servers answering", "应答的服务器"),
    "cards.of": ("of {n}", "/ {n}"),
    "cards.all_answered": ("all servers answered", "所有服务器都已应答"),
    "cards.some_silent": ("{n} did not answer (listed above)", "{n} 台没有应答（见上方）"),
    "cards.sessions": ("Project sessions", "项目会话"),
    "cards.sessions_sub": (
        "conversations with an assistant, on all servers",
        "与助手的对话，所有服务器合计",
    ),
    "cards.running": ("Running now", "正在运行"),
    "cards.working": ("{n} working", "{n} 个工作中"),
    "cards.waiting": ("{n} waiting to retry", "{n} 个等待重试"),
    "cards.asking": ("{n} waiting for a person", "{n} 个在等人回答"),
    "asking.title": ("Waiting for you", "等你回答"),
    "asking.intro": (
        "These assistants stopped to ask something and do nothing until somebody answers; "
        "each still holds one of its server's places.",
        "这些助手停下来提问，在有人回答之前什么也不做；每个仍占用其服务器的一个名额。",
    ),
    "asking.permission": ("asks leave to run {kind}: {what}", "请求允许执行 {kind}：{what}"),
    "asking.question": ("asks: {what}", "提问：{what}"),
    "asking.since": ("waiting {when}", "已等待 {when}"),
    "asking.since_unknown": ("waiting since an unknown time", "等待开始时间未知"),
    "asking.answer": ("answer with", "回答方式"),
    "cards.spread": ("Sessions per server", "每台服务器的会话"),
    "cards.bar_aria": (
        "{name}: {total} sessions, {running} running",
        "{name}：{total} 个会话，{running} 个运行中",
    ),
    "cards.bar_count": ("{total} · {running} running", "{total} · {running} 个运行中"),
    "cards.legend_all": ("all sessions", "全部会话"),
    "cards.legend_run": ("running now", "正在运行"),
    "cards.none_answered": ("No server answered.", "没有服务器应答。"),
    # autopilot panel
    "ap.title": ("Autopilot", "自动巡检"),
    "ap.badge.on": ("on", "运行中"),
    "ap.badge.off": ("off", "未运行"),
    "ap.badge.paused": ("paused", "已暂停"),
    "ap.badge.never": ("never ran", "从未运行"),
    "ap.never": ("The autopilot has never run.", "自动巡检还从未运行过。"),
    "ap.unreadable": ("The autopilot's state could not be read.", "无法读取自动巡检的状态。"),
    "ap.on": (
        "The autopilot is on: it looks after the servers every {every}. Last round {when}: "
        "{how}",
        "自动巡检已开启：每 {every}检查一次服务器。上一轮在{when}：{how}",
    ),
    "ap.off": (
        "The autopilot is not running in the background. It last looked after the servers "
        "{when}: {how}",
        "自动巡检没有在后台运行。它上次检查服务器是在{when}：{how}",
    ),
    "ap.on_first": (
        "The autopilot is on: it looks after the servers every {every}; it has not finished "
        "a round yet.",
        "自动巡检已开启：每 {every}检查一次服务器；它还没有完成过一轮。",
    ),
    "ap.ha_active": (
        "The patrol runs on host {host}; {standby} other daemon(s) stand by to take over.",
        "巡检正在主机 {host} 上运行；另有 {standby} 个守护进程待命接管。",
    ),
    "ap.ha_none": (
        "No patrol daemon holds the lease now: nothing is healed or filled until one takes "
        "it over.",
        "现在没有巡检守护进程持有租约：在有守护进程接管之前，不会修复会话，也不会派发任务。",
    ),
    "ap.ha_unreadable": (
        "Which host runs the patrol could not be read ({error}).",
        "无法读取巡检在哪台主机上运行（{error}）。",
    ),
    "ap.when_unknown": ("at a time its report does not say", "某个报告里没有写明的时间"),
    "ap.all_ok": ("everything went as planned.", "一切按计划完成。"),
    "ap.left_for_person": (
        "{n} thing(s) are left for a person (below).",
        "有 {n} 件事留给人处理（见下方）。",
    ),
    "ap.no_repository": (
        "{n} task(s) finished but are not verified: without project.repository the hub cannot "
        "check an agent's work. Set project.repository to the remote the agents push to "
        "(xaf-hub init --root fills it from the checkout's origin).",
        "{n} 个任务已结束但未验证：没有设置 project.repository，汇总工具无法核对智能体的工作。"
        "请把 project.repository 设为智能体推送到的远程仓库（xaf-hub init --root 会按检出目录的 "
        "origin 填写）。",
    ),
    "ap.some_failed": ("some of it did not work: {steps}.", "有些步骤没有成功：{steps}。"),
    "ap.paused": (
        "It was paused {when}{who}: it fixes nothing and starts no work until someone resumes "
        "it (xaf-hub patrol resume).",
        "它在{when}被{who}暂停：在有人恢复（xaf-hub patrol resume）之前，它不修复任何会话，"
        "也不开始新工作。",
    ),
    "ap.paused_nowhen": (
        "It was paused{who}: it fixes nothing and starts no work until someone resumes it "
        "(xaf-hub patrol resume).",
        "它已被{who}暂停：在有人恢复（xaf-hub patrol resume）之前，它不修复任何会话，"
        "也不开始新工作。",
    ),
    "ap.by": (" by {who}", "{who}"),
    "ap.by_unknown": ("", "某人"),
    "ap.minutes": ("{n} minutes", "{n} 分钟"),
    "ap.needs_person": ("Left for a person: {title}: {detail}", "留给人处理：{title}：{detail}"),
    # A reason in the hub's own words that has no code to translate it by, or those words
    # beside the translation (their names, times and hashes): marked as English.
    "ap.english": ("{words}", "{words}（英文原文）"),
    "ap.as_written": ("{said} (as written: {words})", "{said}（英文原文：{words}）"),
    # why.<code>: why a row is left to a person (``notify.record.Why``).
    "why.interrupted": ("a person stopped its run", "有人停止了它的运行"),
    "why.steered": ("a person steered it by hand", "有人手动给它发了指令"),
    "why.decided": ("a person stopped or steered it", "有人停止了它或手动给它发了指令"),
    "why.unresumed": ("its run was interrupted and not resumed", "它的运行被中断，且没有恢复"),
    "why.denied": ("its run ended on a refused request", "它的运行因请求被拒绝而结束"),
    "why.missing": (
        "not verified: the commit it reported is not on the repository",
        "未验证：它报告的提交不在项目仓库里",
    ),
    "why.ambiguous": (
        "not verified: the commit it reported could be several",
        "未验证：它报告的提交编号可能指向多个提交",
    ),
    "why.no_claim": ("not verified: it reported no commit", "未验证：它没有报告提交"),
    "why.old": ("not verified: its commits are not new work", "未验证：它的提交不是新的工作"),
    "why.locked": (
        "not verified: its commits change files that are locked",
        "未验证：它的提交改动了被锁定的文件",
    ),
    "why.diverged": (
        "not verified: the commits it reported lie on different lines of history",
        "未验证：它报告的提交不在同一条历史线上",
    ),
    "why.too_many": (
        "not verified: too many commits to judge",
        "未验证：提交太多，无法判断",
    ),
    "why.credited": (
        "not verified: its commit is counted for another task",
        "未验证：它的提交已算在另一个任务名下",
    ),
    "why.check_failed": (
        "the project's check failed on its commit",
        "项目的检查在它的提交上没有通过",
    ),
    "why.production": (
        "a production instance: the patrol never writes there",
        "生产实例：巡检从不在那里写入",
    ),
    "why.resumed_once": (
        "interrupted again after the patrol resumed it once",
        "巡检恢复过一次后它又被中断了",
    ),
    "ap.parked": (
        "Left for a person: {title}: parked: {why}",
        "留给人处理：{title}：已搁置：{why}",
    ),
    "ap.last_round": ("In its last round", "上一轮"),
    "ap.queue": ("Work queue", "任务队列"),
    "ap.next": ("Next to start", "接下来要开始的"),
    "ap.done": ("Recently finished", "最近结束"),
    "ap.verified_hint": (
        "the patrol found this commit on the project's repository",
        "巡检已在项目仓库中找到这个提交",
    ),
    "ap.not_verified_hint": (
        "finished on the agent's word or a person's: no commit was checked",
        "凭智能体或人工的说法结束：没有核对提交",
    ),
    "ap.priority_hint": ("Priority: P0 is the most urgent", "优先级：P0 最紧急"),
    "ap.rest": (
        "Models from “{family}” are not used until {exact} ({when}): the provider refused for "
        "too many requests.",
        "“{family}” 的模型在 {exact}（{when}）之前不再使用：服务商因请求过多而拒绝。",
    ),
    "ap.rest_stated": (
        "“{family}” is not used until {exact} ({when}): the provider refused for too many "
        "requests and said when it takes work again.",
        "“{family}” 在 {exact}（{when}）之前不再使用：服务商因请求过多而拒绝，并说明了何时恢复。",
    ),
    "ap.rest_person": (
        "“{family}” is not used until {exact} ({when}): a person rested it.",
        "“{family}” 在 {exact}（{when}）之前不再使用：由人工暂停。",
    ),
    "ap.spend": ("Spent today: {spent}.", "今日已花费 {spent}。"),
    "ap.spend_of": (
        "Spent today: {spent} of the daily budget {budget} ({share} %).",
        "今日已花费 {spent}，每日预算 {budget}（{share}%）。",
    ),
    "ap.spend_reached": (
        "The budget is reached: no new work starts until tomorrow.",
        "预算已用完：明天之前不再开始新的工作。",
    ),
    "ap.spend_unknown": (
        "Cost unknown for {n} sessions (their server reports none usable).",
        "{n} 个会话费用未知（其服务器没有给出可用的费用）。",
    ),
    "ap.spend_not_counted": (
        "{n} servers did not answer: their spend is not counted.",
        "{n} 台服务器没有应答：其花费未计入。",
    ),
    "ap.spend_silent": (
        "{name}: spend unknown, the server did not answer.",
        "{name}：花费未知，服务器没有应答。",
    ),
    "ap.report_unreadable": (
        "The last autopilot report could not be read ({error}).",
        "无法读取上一份自动巡检报告（{error}）。",
    ),
    "ap.queue_unreadable": (
        "The work queue could not be read ({error}).",
        "无法读取任务队列（{error}）。",
    ),
    "ap.rests_unreadable": (
        "The list of resting AI providers could not be read ({error}).",
        "无法读取暂停使用的 AI 服务商列表（{error}）。",
    ),
    "step.fix_free_limit": ("fixing sessions stopped by a rate limit", "修复因限流而停下的会话"),
    "step.check_agents": ("checking on the sessions", "检查各个会话"),
    "step.sync_design_tasks": ("reading the design documents", "读取设计文档"),
    "step.run_ceiling": ("stopping runs over their ceiling", "停止超过上限的运行"),
    "step.fill_slots": ("starting queued work", "开始排队的工作"),
    "fig.dispatched": ("started from the queue", "从队列中开始"),
    "fig.tasks_done": ("done and verified", "已完成并验证"),
    "fig.tasks_finished": ("finished, not verified", "已结束，未验证"),
    "fig.healed": ("fixed after a rate limit", "限流后已修复"),
    "fig.resumed": ("resumed after an interruption", "中断后已恢复"),
    "fig.tasks_requeued": ("sent back to the queue", "退回队列"),
    "fig.design_tasks_added": ("added from design documents", "从设计文档中添加"),
    "fig.over_run_ceiling": (
        "stopped over the run ceiling (a person decides)",
        "超过单次运行上限而被停止(等人处理)",
    ),
    # notes and glossary
    "notes.head": ("Notes from the scan", "扫描时的提示"),
    "config.kept": (
        "{who} keeps the config it loaded at {loaded}: the saved one does not load ({problem}); "
        "it is read again once saved",
        "{who}仍在使用 {loaded} 载入的配置：保存的新配置无法载入（{problem}）；"
        "改好并保存后会重新读取",
    ),
    "config.restart": (
        "{who} needs a restart to use the new {keys} (until then it keeps the old value)",
        "{who}需要重启才能使用新的 {keys}（在此之前沿用旧值）",
    ),
    "config.serve": ("serve (this page's server)", "本页的服务（serve）"),
    "config.patrol": ("the patrol daemon", "巡检守护进程"),
    "help.summary": ("What do these words mean?", "这些词是什么意思？"),
    "help.server": ("Server", "服务器"),
    "help.server_d": (
        "A computer that runs the coding assistant. The team has several.",
        "运行编程助手的一台电脑。团队有好几台。",
    ),
    "help.session": ("Session", "会话"),
    "help.session_d": (
        "One conversation in which the assistant works on a task, inside one project folder.",
        "助手在某个项目文件夹里处理一项任务的一次对话。",
    ),
    "help.working_d": (
        "The assistant is busy on this session right now.",
        "助手此刻正在处理这个会话。",
    ),
    "help.waiting_d": (
        "The AI provider asked us to slow down (a rate limit); the assistant tries again by "
        "itself. The provider's message is shown under the word.",
        "AI 服务商要求放慢速度（限流）；助手会自己重试。服务商的原话显示在这个词下面。",
    ),
    "help.asking_d": (
        "The assistant stopped to ask a person (leave to run a command, or a question) and "
        "waits for an answer; the list \"Waiting for you\" says how to give it.",
        "助手停下来请人决定（是否允许执行某个命令，或回答一个问题），正在等待回答；"
        "\"等你回答\"列表说明如何回答。",
    ),
    "help.idle_d": (
        "Nothing is happening in this session at the moment.",
        "这个会话目前没有在做任何事。",
    ),
    "help.result": ("Last result", "上次结果"),
    "help.result_d": (
        "How the most recent piece of work ended. Only a green word means nobody needs to "
        "look; a yellow one waits for a person, a red one went wrong.",
        "最近一项工作的结局。只有绿色的词表示无需有人查看；黄色的等人处理，红色的出了问题。",
    ),
    "help.autopilot_d": (
        "The hub's own regular round over the servers: it restarts work that an AI provider "
        "stopped for too many requests (switching to another model), resumes interrupted "
        "sessions, and starts queued tasks when a server has room. “On” means it is running "
        "in the background right now.",
        "汇总工具自己定期对服务器做的巡检："
        "重新开始因请求过多被 AI 服务商停下的工作（换用另一个模型），"
        "恢复被中断的会话，并在服务器有空位时开始排队的任务。“运行中”表示它此刻正在后台运行。",
    ),
    "help.task": ("Task number", "任务编号"),
    "help.task_d": (
        "The small grey label such as T-20261130-7275 is the queue's number for the task the "
        "session works on.",
        "像 T-20261130-7275 这样的灰色小标签，是该会话所处理任务在队列里的编号。",
    ),
    "help.open": ("Open", "打开"),
    "help.open_d": (
        "Opens the session in the assistant's own web page, on its server. A server with a "
        "password asks for its login (its section says the user name; the password is never on "
        "this page); the link works only from a computer that can reach that server.",
        "在服务器自带的网页里打开这个会话。设了密码的服务器会要求登录（它那一栏写明用户名；"
        "密码从不出现在本页）；只有能连到那台服务器的电脑才能打开。",
    ),
    "help.cost": ("Cost", "费用"),
    "help.cost_d": (
        "What the AI provider charged for this session so far, in US dollars.",
        "到目前为止 AI 服务商为这个会话收取的费用，单位为美元。",
    ),
    # filter
    "filter.label": ("Find", "查找"),
    "filter.project": ("Project", "项目"),
    "filter.placeholder": (
        "Part of a title, folder or session id",
        "标题、文件夹或会话编号的一部分",
    ),
    "filter.shown": ("{shown} of {total} shown", "显示 {shown} / {total}"),
    "filter.none": ("No session matches what you typed.", "没有与输入内容匹配的会话。"),
    # server sections
    "sec.not_answering": ("not answering", "没有应答"),
    "sec.production": ("production", "生产环境"),
    "sec.production_hint": (
        "Live production server: the hub only reads from it unless told otherwise.",
        "正式生产服务器：除非另有指示，汇总工具只读取它的信息。",
    ),
    "sec.running": ("{running} running (limit {limit})", "{running} 个运行中（上限 {limit}）"),
    "sec.unreachable": (
        "This server could not be reached: {reason}. Its sessions are not included in the "
        "figures above.",
        "无法连接这台服务器：{reason}。它的会话没有计入上面的数字。",
    ),
    "sec.detail": ("Technical detail", "技术细节"),
    "sec.empty": (
        "No sessions for this project on this server.",
        "这台服务器上没有这个项目的会话。",
    ),
    # table
    "col.title": ("Title", "标题"),
    "col.folder": ("Folder", "文件夹"),
    "col.status": ("Status", "状态"),
    "col.activity": ("Last activity", "最近活动"),
    "col.started": ("Started", "开始时间"),
    "col.result": ("Last result", "上次结果"),
    "col.cost": ("Cost", "费用"),
    "row.untitled": ("(untitled)", "（无标题）"),
    "row.open": ("open", "打开"),
    "row.open_hint": (
        "Open this session in its server's own web page (it may ask for the server's login)",
        "在服务器自带的网页里打开这个会话（可能需要登录该服务器）",
    ),
    "sec.login": (
        "The “open ↗” links lead to this server's own page, which asks for a login: the user "
        "name “{user}” and the server's password. Whoever runs the server has it; this page "
        "never holds it.",
        "“打开 ↗”链接会进入这台服务器自带的网页，它会要求登录：用户名“{user}”和这台服务器的"
        "密码。密码在管理这台服务器的人那里；本页从不保存它。",
    ),
    "row.task_hint": ("Task number in the work queue", "任务队列中的编号"),
    # run states and results
    "state.busy": ("working", "工作中"),
    "state.retry": ("waiting to retry (rate limit)", "等待重试（限流）"),
    "state.asking": ("waiting for a person", "等人回答"),
    "state.idle": ("idle", "空闲"),
    "state.retry_said": ("The AI provider said: {message}", "AI 服务商说：{message}"),
    "state.retry_next": ("Next try: {when}, {exact}.", "下次重试：{when}，{exact}。"),
    "state.retry_now": ("now", "现在"),
    "state.retry_plain": (
        "The AI provider asked us to slow down; it retries by itself.",
        "AI 服务商要求放慢速度；它会自己重试。",
    ),
    "result.not_checked": ("not checked", "未检查"),
    "result.not_checked_d": (
        "The result of the last run was not checked.",
        "没有检查上次运行的结果。",
    ),
    # plain reasons a server did not answer
    "reason.auth": ("the server refused our login", "服务器拒绝了我们的登录"),
    "reason.dns": ("the server's address could not be found", "找不到服务器的地址"),
    "reason.refused": (
        "nothing is answering at the server's address (it may be switched off)",
        "服务器地址上没有程序应答（可能已关机）",
    ),
    "reason.timeout": ("the server did not answer in time", "服务器没有及时应答"),
    "reason.html": (
        "the address answers, but not as a coding-assistant server (wrong address?)",
        "这个地址有应答，但不是编程助手服务器（地址错了？）",
    ),
    "reason.5xx": ("the server reported an internal error", "服务器报告了内部错误"),
    "reason.garbled": ("the server sent a garbled answer", "服务器发来的回答是乱的"),
    "reason.tls": (
        "a secure connection to the server could not be made",
        "无法与服务器建立安全连接",
    ),
    "reason.other": ("the server could not be reached", "无法连接服务器"),
    # relative times
    "time.unknown": ("unknown", "未知"),
    "cost.unknown": ("unknown", "未知"),
    "time.now": ("just now", "刚刚"),
    "time.ago": ("{span} ago", "{span}前"),
    "time.ahead": ("in {span}", "{span}后"),
    "unit.minute": ("minute|minutes", "分钟"),
    "unit.hour": ("hour|hours", "小时"),
    "unit.day": ("day|days", "天"),
    "unit.month": ("month|months", "个月"),
    "unit.year": ("year|years", "年"),
    # a run's outcome and a task's state ("run.<value>", "task.<value>"); "..._d": what it means
    "run.succeeded": ("succeeded", "成功"),
    "run.succeeded_d": ("The model finished its answer.", "模型完成了它的回答。"),
    "run.failed": ("failed", "失败"),
    "run.failed_d": ("The last run ended with an error.", "上次运行以错误结束。"),
    "run.denied": ("denied", "被拒绝"),
    "run.denied_d": (
        "The run ended because a request it made was refused: a permission denied or a "
        "question dismissed. A person decides what comes next.",
        "运行因它的请求被拒绝而结束：权限被拒绝或问题被驳回。接下来怎么做由人决定。",
    ),
    "run.ceiling": ("stopped at its ceiling", "超过上限被停止"),
    "run.ceiling_d": (
        "The hub stopped the run because it cost more than its run ceiling; a person decides.",
        "这次运行的花费超过了单次运行上限，已被汇总工具停止；由人决定接下来怎么做。",
    ),
    "run.interrupted": ("interrupted", "被中断"),
    "run.interrupted_d": (
        "The run stopped before it finished: a person stopped it, or its server did (a "
        "restart?).",
        "运行在完成前停止了：有人停止了它，或者它的服务器停止了它（重启？）。",
    ),
    "run.rate_limited": ("rate-limited", "被限流"),
    "run.rate_limited_d": (
        "The AI provider refused the last run because of too many requests.",
        "AI 服务商因请求过多拒绝了上次运行。",
    ),
    "run.running": ("running", "运行中"),
    "run.running_d": ("The run is still going.", "运行仍在进行。"),
    "run.not_started": ("not started", "未开始"),
    "run.not_started_d": (
        "The session has no answer from the assistant yet.",
        "这个会话里助手还没有回答过。",
    ),
    "task.waiting": ("waiting to start", "等待开始"),
    "task.blocked": ("blocked after too many failed tries", "多次失败后受阻"),
    "task.person": ("needs a person", "等人处理"),
    "task.in_progress": ("in progress", "进行中"),
    "task.unverified": ("finished, not verified", "已结束，未验证"),
    "task.verified": ("done and verified", "已完成并验证"),
    "task.ready_to_land": ("ready to land", "待合入"),
    "task.conflict": ("conflict, sent back", "有冲突，已退回"),
    "task.land_by_person": ("waits for a person to land it", "等人合入"),
    "task.landed": ("landed", "已合入"),
    "task.dropped": ("dropped", "已放弃"),
    # chat: an event's headline (chat.<type>) and body (chat.<type>.body)
    "chat.task_done": ("Task done: {title}", "任务完成:{title}"),
    "chat.task_done.body": (
        "Task {task} finished in its session on {instance}.{judged}",
        "任务 {task} 已在 {instance} 上的会话中完成。{judged}",
    ),
    "chat.task_finished": ("Task finished, not verified: {title}", "任务已结束,未验证:{title}"),
    "chat.task_finished.body": (
        "Task {task} finished in its session on {instance}, on the agent's word: without project."
        "repository the hub cannot check its work. Set project.repository to the remote the "
        "agents push to.",
        "任务 {task} 已在 {instance} 上的会话中结束,这只是智能体的说法:没有设置 "
        "project.repository,汇总工具无法核对它的工作。请把 project.repository "
        "设为智能体推送到的远程仓库。",
    ),
    "chat.task_parked": ("Task parked: {title}", "任务搁置:{title}"),
    "chat.task_parked.body": (
        "Task {task} is parked and waits for a person ({attempts} failed attempt(s)): {error}\nTo "
        "try it again: xaf-hub backlog set {task} --status pending --reset",
        "任务 {task} 已搁置,等人处理(失败 {attempts} 次):{error}\n重新排队:xaf-hub backlog set "
        "{task} --status pending --reset",
    ),
    "chat.needs_person": ("Needs a person: {title}", "需要人工处理:{title}"),
    "chat.needs_person.body": (
        "Session “{title}” on {instance} {state}",
        "{instance} 上的会话“{title}”{state}",
    ),
    "chat.waiting_person": ("Waiting for a person: {title}", "等人回答:{title}"),
    "chat.waiting_person.body": (
        "Session “{title}” on {instance} stopped and waits: {detail}. It holds one of the "
        "server's places until answered.\nTo answer: {answer}",
        "{instance} 上的会话“{title}”停下来等待:{detail}。"
        "回答之前它一直占用服务器的一个名额。\n回答方式:{answer}",
    ),
    "chat.healed": ("Healed: {title}", "已自动恢复:{title}"),
    "chat.healed.body": (
        "Session “{title}” on {instance} hit a limit on {from_model}; it goes on with {model}.",
        "{instance} 上的会话“{title}”在 {from_model} 上遇到限额,已改用 {model} 继续。",
    ),
    "chat.blackout": ("Provider resting: {family}", "模型暂停使用:{family}"),
    "chat.blackout.body": (
        "{family} models hit a rate limit. The hub stops using them until {until}.",
        "{family} 系列模型遇到限流,{until} 之前不再使用。",
    ),
    "chat.run_ceiling": ("Run stopped over its ceiling: {title}", "运行超过上限已停止:{title}"),
    "chat.run_ceiling.body": (
        "Session “{title}” on {instance} was stopped: {reason}",
        "{instance} 上的会话“{title}”已被停止:{reason}",
    ),
    "chat.rest_ended": ("Rest ended: {family}", "模型恢复使用:{family}"),
    "chat.rest_ended.body": (
        "{family} no longer rests (it was to rest until {until}): ended by a person. The hub uses "
        "it again.",
        "{family} 的暂停(原定到 {until})已由人工结束,系统重新使用它。",
    ),
    "chat.instance_down": ("Server down: {instance}", "服务器无响应:{instance}"),
    "chat.instance_down.body": (
        "{instance} does not answer ({reason}). Its work waits until it is back.",
        "{instance} 没有响应({reason})。它上面的工作等它恢复后继续。",
    ),
    "chat.instance_up": ("Server back: {instance}", "服务器已恢复:{instance}"),
    "chat.instance_up.body": ("{instance} answers again.", "{instance} 又能正常响应了。"),
    "chat.daily_summary": ("Daily summary for {day}", "{day} 每日汇总"),
    "chat.daily_summary.body": (
        "Last 24 hours: {done} task(s) done and verified, {finished} finished but not verified, "
        "{parked} parked, {healed} healed, {people} needing a person.\nNow: {running} running, "
        "{asking} waiting for a person, {waiting} waiting in the queue; {up} of {servers} "
        "server(s) answering.",
        "过去 24 小时:完成并验证 {done} 个任务,结束但未验证 {finished} 个,搁置 {parked} 个,"
        "自动恢复 {healed} 次,{people} 次需要人工处理。\n"
        "现在:{running} 个在运行,{asking} 个在等人回答,{waiting} 个在排队;"
        "{servers} 台服务器中 {up} 台正常响应。",
    ),
    "chat.budget": ("Daily budget {level} % spent: {scope}", "每日预算已用 {level}%:{scope}"),
    "chat.budget.body": (
        "{scope} spent {spent} of its daily budget {budget} today ({day}). {budget_next}",
        "{scope} 今天({day})已花费 {spent},每日预算 {budget}。{budget_next}",
    ),
    "chat.failover": (
        "Patrol moved: {from_host} → {to_host}",
        "巡检已转移:{from_host} → {to_host}",
    ),
    "chat.failover.body": (
        "The patrol moved from host {from_host} to host {to_host}: {from_host} stopped renewing "
        "its lease, and {to_host} now heals and fills the fleet.",
        "巡检从主机 {from_host} 转移到了主机 {to_host}:{from_host} 不再续租,"
        "现在由 {to_host} 负责修复会话和派发任务。",
    ),
    "chat.test": ("Test message", "测试消息"),
    "chat.test.body": (
        "A test from xaf-hub for the webhook “{webhook}”. If you can read this, notifications "
        "work.",
        "这是 xaf-hub 发给 webhook“{webhook}”的测试消息。能看到它,说明通知已经接通。",
    ),
    # chat: what a session needing a person did (chat.state.<state>; plain: any other)
    "chat.state.failed": ("stopped with an error: {detail}", "出错停下了:{detail}"),
    "chat.state.interrupted": (
        "was interrupted and will not be restarted automatically: {detail}",
        "被中断了,不会再自动续跑:{detail}",
    ),
    "chat.state.stale_busy": (
        "has been busy with no progress for a long time: {detail}",
        "长时间忙碌却没有进展:{detail}",
    ),
    "chat.state.person": (
        "— {detail}. The patrol leaves it alone until someone acts.",
        "——{detail}。在有人处理之前,巡检不会再动它。",
    ),
    "chat.state": ("needs a look: {detail}", "需要有人看一下:{detail}"),
    "chat.budget.100": (
        "No new work starts until tomorrow; runs already started go on.",
        "明天之前不再开始新的工作;已开始的运行继续。",
    ),
    "chat.budget.80": (
        "New work stops when the budget is reached.",
        "预算用完后将不再开始新的工作。",
    ),
    "chat.project": ("The project", "项目"),
    "chat.prefix": ("[xaf-hub · {project}]", "[xaf-hub · {project}]"),
    "chat.link": ("Overview: {url}", "总览页:{url}"),
}


def text(lang: str, key: str, **values: object) -> str:
    """The ``lang`` wording of ``key`` (Chinese for "zh", else English) with ``{name}``
    placeholders filled."""
    words = TEXT[key][lang == "zh"]
    return words.format(**values) if values else words

