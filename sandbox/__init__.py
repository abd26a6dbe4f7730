"""The test-and-demo harness of a checkout, never installed with the wheel.

``fake_llm`` (an OpenAI-compatible model on 127.0.0.1), ``fleet`` (real ``opencode serve``
processes, offline and isolated), ``releases`` (the release matrix's binaries) and ``demo``
(``python -m sandbox.demo``: the README's tour). It imports the hub; the hub never imports it.
"""
