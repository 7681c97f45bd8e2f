"""The job runner's record of each job's attempts (retries, logs, HTML export): the table
``gpuspawner_job_runs``, made here unless ``create_all`` made it before alembic ran the
schema (a database of schema 3 used by the job runner of that time has it already).

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sa.inspect(op.get_bind()).has_table("gpuspawner_job_runs"):
        return
    op.create_table(
        "gpuspawner_job_runs",
        sa.Column("job_id", sa.String(32), primary_key=True),
        sa.Column("max_retries", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Text(), nullable=False),
        sa.Column("logs", sa.LargeBinary(), nullable=True),
        sa.Column("html", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    op.drop_table("gpuspawner_job_runs")
