"""Schema 1: one table of jobs, and the version table that came before alembic.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpuspawner_jobs_schema",
        sa.Column("version", sa.Integer(), primary_key=True))
    op.create_table(
        "gpuspawner_jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("groups", sa.Text(), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("profile", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("time_limit", sa.Integer(), nullable=False),
        sa.Column("parameters", sa.Text(), nullable=False),
        sa.Column("notebook", sa.LargeBinary(), nullable=False),
        sa.Column("created", sa.Float(), nullable=False),
        sa.Column("started", sa.Float(), nullable=True),
        sa.Column("finished", sa.Float(), nullable=True),
        sa.Column("history", sa.Text(), nullable=False),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("gpu_uuids", sa.Text(), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("output_dir", sa.Text(), nullable=False),
        sa.Column("allocation", sa.Text(), nullable=True),
        sa.Column("backend_state", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("output", sa.LargeBinary(), nullable=True))
    op.create_index("ix_gpuspawner_jobs_user", "gpuspawner_jobs", ["user"])
    op.create_index("ix_gpuspawner_jobs_state", "gpuspawner_jobs", ["state"])
    op.execute("INSERT INTO gpuspawner_jobs_schema (version) VALUES (1)")


def downgrade() -> None:
    op.drop_table("gpuspawner_jobs")
    op.drop_table("gpuspawner_jobs_schema")
