"""The outbox as an earlier agent left it on disk (the in-place migration's input)."""

# The table as the previous agent created it (edge/outbox.py before typed rows).
OLD_SCHEMA = """
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    priority INTEGER NOT NULL,
    topic TEXT NOT NULL,
    body BLOB NOT NULL,
    image BLOB,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    size INTEGER NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX messages_drop ON messages (priority, id);
CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
