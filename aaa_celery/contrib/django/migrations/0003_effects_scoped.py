"""Effects are recorded per tenant and tool (issue 35): the ``tenant`` and ``tool`` columns, and
each row recorded by 0.2.0 moved to its call's tenant, for any tool
(:func:`aaa_celery.effects.upgraded`, the rule ``EffectLog.upgrade`` applies too)."""

from typing import Any, ClassVar

from django.db import migrations, models


def move_old_rows(apps: Any, schema_editor: Any) -> None:
    from aaa_celery.effects import upgraded

    effects = apps.get_model("aaa_celery", "Effect").objects.using(schema_editor.connection.alias)
    for key, call_id in list(effects.filter(tool__isnull=True).values_list("key", "call_id")):
        scope = upgraded(key, call_id)
        effects.filter(key=key, tool__isnull=True).update(key=scope.key, tenant=scope.tenant, tool=scope.tool)


class Migration(migrations.Migration):
    dependencies: ClassVar[list[tuple[str, str]]] = [("aaa_celery", "0002_task_calls")]

    operations = [
        migrations.AddField(model_name="effect", name="tenant", field=models.TextField(null=True)),
        migrations.AddField(model_name="effect", name="tool", field=models.TextField(null=True)),
        migrations.RunPython(move_old_rows, migrations.RunPython.noop),
    ]
