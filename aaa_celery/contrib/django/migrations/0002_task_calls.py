"""The outbox and enqueue records of the django.tasks backend (issue 37)."""

from typing import ClassVar

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies: ClassVar[list[tuple[str, str]]] = [("aaa_celery", "0001_effects")]

    operations = [
        migrations.CreateModel(
            name="TaskCall",
            fields=[
                ("id", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("backend", models.CharField(max_length=100)),
                ("task_path", models.TextField()),
                ("args", models.JSONField(default=list)),
                ("kwargs", models.JSONField(default=dict)),
                ("queue_name", models.CharField(max_length=200)),
                ("priority", models.IntegerField(default=0)),
                ("run_after", models.DateTimeField(null=True)),
                ("enqueued_at", models.DateTimeField()),
                ("published_at", models.DateTimeField(null=True)),
                ("error_path", models.TextField(blank=True, default="")),
                ("error_traceback", models.TextField(blank=True, default="")),
            ],
            options={
                "db_table": "aaa_django_tasks",
                "indexes": [models.Index(fields=["published_at", "enqueued_at"], name="aaa_django_tasks_unsent")],
            },
        ),
    ]
