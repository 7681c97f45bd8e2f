"""Each job's and job definition's ``options``: the image its submitter chose
(``image`` / ``image--unlisted-choice``), the output formats and the input folder, as JSON
text (``{}`` for the rows made before: the profile's image, every format, no folder).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TABLES = ("gpuspawner_jobs", "gpuspawner_job_definitions")


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    for table in TABLES:
        if "options" in {c["name"] for c in inspector.get_columns(table)}:
            continue  # made by create_all with this schema
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("options", sa.Text(), nullable=False,
                                       server_default="{}"))


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("options")
