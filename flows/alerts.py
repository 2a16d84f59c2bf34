"""Alerts: a Prefect automation that sends each regression the nightly flow finds to a webhook.

The flow emits ``replaybench.regression.detected`` (and ``replaybench.improvement.detected``) for
each new FASTER/SLOWER verdict (``flows.benchmark.alert``); ``replaybench alerts --webhook URL``
creates, idempotently, a notification block posting ``{"text": subject + body}`` to URL (Slack and
Mattermost incoming webhooks take that as is) and an automation that fires it on each regression
event.
"""

from __future__ import annotations

from prefect.automations import Automation, EventTrigger, SendNotification
from prefect.blocks.notifications import CustomWebhookNotificationBlock

EVENT = "replaybench.regression.detected"
SUBJECT = "replaybench: {{ event.resource['replaybench.config'] }} {{ event.resource['replaybench.mode'] }} slower"
BODY = ("{{ event.resource['replaybench.change'] }} in run {{ event.resource['replaybench.run'] }}"
        "{% if event.resource['replaybench.cause'] %} (likely cause: {{ event.resource['replaybench.cause'] }}){% endif %}: "
        "{{ event.payload.reason }}")


def create_alert(url: str, name: str = "replaybench-regressions", allow_private_url: bool = False) -> Automation:
    """The webhook block and the automation, named ``name``; both replaced if they exist."""
    block = CustomWebhookNotificationBlock(name=name, url=url, json_data={"text": "{{subject}}\n{{body}}"},
                                           allow_private_urls=allow_private_url)
    block_id = block.save(name, overwrite=True)
    while (existing := _existing(name)) is not None:
        existing.delete()
    return Automation(
        name=name,
        description="replaybench: a message for each regression the nightly verdicts find",
        trigger=EventTrigger(expect={EVENT}, match={"prefect.resource.id": "replaybench.config.*"},
                             posture="Reactive", threshold=1, within=0),
        actions=[SendNotification(block_document_id=block_id, subject=SUBJECT, body=BODY)],
    ).create()


def _existing(name: str) -> Automation | None:
    try:
        return Automation.read(name=name)
    except ValueError:
        return None
