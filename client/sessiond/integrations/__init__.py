"""Drop-in session stores for agent SDKs, one module per SDK, each behind its own extra.

`import sessiond` imports none of them; `from sessiond.integrations.openai_agents import
SessiondSession` needs `pip install 'sessiond[openai-agents]'`.
"""
