"""Shared test support: one fake backend and the checkpoint builders every test module uses.

Import as ``from tests.support.<module> import ...`` (the repository root is on pytest's
``pythonpath``); nothing here is collected as a test.
"""
