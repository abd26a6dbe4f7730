"""Chat notifications of patrol and fleet events (task done, needs a person, server down...).

``patrol`` queues a round's events under its lock and sends them outside it; ``outbox`` is the
durable state; ``derive`` and ``formats`` are pure (docs/notifications.md, docs/architecture.md §8).
"""
