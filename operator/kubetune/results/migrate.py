"""Keeping a database written by an older kubetune working: columns added to the
schema since are added to the tables that lack them (``ALTER TABLE ... ADD COLUMN``
with the column's server default), so existing rows read as that default.

Only additive changes are made this way; each new column must be nullable or have a
``server_default`` (checked here, so a column that could not be added fails the
first test that opens an old database rather than a user's upgrade)."""
from __future__ import annotations

from sqlalchemy import Engine, inspect
from sqlalchemy.schema import CreateColumn

from kubetune.results import schema


def missing_columns(engine: Engine) -> dict[str, list[str]]:
    """Table -> the schema's columns that table lacks (tables that do not exist yet are
    not listed: ``create_all`` makes them whole)."""
    inspector = inspect(engine)
    missing: dict[str, list[str]] = {}
    for table in schema.metadata.sorted_tables:
        if not inspector.has_table(table.name):
            continue
        present = {column["name"] for column in inspector.get_columns(table.name)}
        absent = [c.name for c in table.columns if c.name not in present]
        if absent:
            missing[table.name] = absent
    return missing


def add_missing_columns(engine: Engine) -> list[str]:
    """Add them; returns ``table.column`` of each column added."""
    added = []
    for table_name, names in missing_columns(engine).items():
        table = schema.metadata.tables[table_name]
        for name in names:
            column = table.columns[name]
            if not column.nullable and column.server_default is None:
                raise RuntimeError(f"results store: cannot add {table_name}.{name} to an existing table: "
                                   "a new column needs nullable=True or a server_default")
            ddl = CreateColumn(column).compile(dialect=engine.dialect)
            try:
                with engine.begin() as connection:
                    connection.exec_driver_sql(f"ALTER TABLE {table_name} ADD COLUMN {ddl}")
            except Exception:
                # another process (the operator and `kubetune results`) added it meanwhile
                if name not in missing_columns(engine).get(table_name, []):
                    continue
                raise
            added.append(f"{table_name}.{name}")
    return added
