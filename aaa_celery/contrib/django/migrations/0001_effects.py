"""The tables of :func:`aaa_celery.contrib.django.effects.once` (issue 24)."""

from typing import ClassVar

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []

    operations = [
        migrations.CreateModel(
            name="Effect",
            fields=[
                ("key", models.TextField(primary_key=True, serialize=False)),
                ("call_id", models.TextField()),
                ("attempt", models.IntegerField()),
                ("result", models.TextField()),
            ],
            options={"db_table": "aaa_effects"},
        ),
        migrations.CreateModel(
            name="EffectFence",
            fields=[
                ("key", models.TextField(primary_key=True, serialize=False)),
                ("fence", models.BigIntegerField()),
            ],
            options={"db_table": "aaa_effect_fences"},
        ),
    ]
