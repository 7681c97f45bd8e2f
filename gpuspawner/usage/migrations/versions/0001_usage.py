"""Schema 1: one row per booked bundle (server or job): who, what was reserved, when, and
what was used.

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
        "gpuspawner_usage",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("allocation_id", sa.String(64), nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("groups", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("profile", sa.String(255), nullable=False),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("gpu_uuids", sa.Text(), nullable=False),
        sa.Column("gpu_model", sa.String(255), nullable=False),
        sa.Column("gpu_milli", sa.Integer(), nullable=False),
        sa.Column("cpu_milli", sa.Integer(), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("disk_bytes", sa.BigInteger(), nullable=False),
        sa.Column("started", sa.Float(), nullable=False),
        sa.Column("ended", sa.Float(), nullable=True),
        sa.Column("closed_at_restart", sa.Boolean(), nullable=False),
        sa.Column("gpu_util_percent", sa.Float(), nullable=True),
        sa.Column("gpu_mem_peak_bytes", sa.BigInteger(), nullable=True),
        sa.Column("gpu_used", sa.Text(), nullable=True),
        sa.Column("cpu_seconds", sa.Float(), nullable=True),
    )
    op.create_index("ix_gpuspawner_usage_allocation_id", "gpuspawner_usage", ["allocation_id"])
    op.create_index("ix_gpuspawner_usage_user", "gpuspawner_usage", ["user"])
    op.create_index("ix_gpuspawner_usage_started", "gpuspawner_usage", ["started"])
    op.create_index("ix_gpuspawner_usage_ended", "gpuspawner_usage", ["ended"])


def downgrade() -> None:
    op.drop_table("gpuspawner_usage")
