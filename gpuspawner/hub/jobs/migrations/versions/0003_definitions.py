"""Schema 3: job definitions (a notebook on a cron schedule) and a job's ``definition_id``.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpuspawner_jobs") as batch:
        batch.add_column(sa.Column("definition_id", sa.String(32), nullable=True))
        batch.create_index("ix_gpuspawner_jobs_definition_id", ["definition_id"])
    op.create_table(
        "gpuspawner_job_definitions",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("groups", sa.Text(), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("profile", sa.String(255), nullable=False),
        sa.Column("time_limit", sa.Integer(), nullable=False),
        sa.Column("parameters", sa.Text(), nullable=False),
        sa.Column("notebook", sa.LargeBinary(), nullable=False),
        sa.Column("schedule", sa.String(200), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("concurrency_policy", sa.String(16), nullable=False),
        sa.Column("starting_deadline", sa.Integer(), nullable=True),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("created", sa.Float(), nullable=False),
        sa.Column("updated", sa.Float(), nullable=False),
        sa.Column("last_tick", sa.Float(), nullable=False),
        sa.Column("next_tick", sa.Float(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("last_job_id", sa.String(32), nullable=True),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("skipped", sa.Integer(), nullable=False))
    op.create_index("ix_gpuspawner_job_definitions_user", "gpuspawner_job_definitions",
                    ["user"])
    op.create_index("ix_gpuspawner_job_definitions_next_tick", "gpuspawner_job_definitions",
                    ["next_tick"])
    op.execute("UPDATE gpuspawner_jobs_schema SET version = 3")


def downgrade() -> None:
    op.drop_table("gpuspawner_job_definitions")
    with op.batch_alter_table("gpuspawner_jobs") as batch:
        batch.drop_index("ix_gpuspawner_jobs_definition_id")
        batch.drop_column("definition_id")
    op.execute("UPDATE gpuspawner_jobs_schema SET version = 2")
