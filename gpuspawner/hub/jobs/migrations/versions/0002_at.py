"""Schema 2: a job's one-off start time (``at``).

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpuspawner_jobs") as batch:
        batch.add_column(sa.Column("not_before", sa.Float(), nullable=True))
    op.execute("UPDATE gpuspawner_jobs_schema SET version = 2")


def downgrade() -> None:
    with op.batch_alter_table("gpuspawner_jobs") as batch:
        batch.drop_column("not_before")
    op.execute("UPDATE gpuspawner_jobs_schema SET version = 1")
