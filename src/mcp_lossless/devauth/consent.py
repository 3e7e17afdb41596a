"""The two HTML pages of the development AS: consent (when not auto-approving) and a rejected request."""

from __future__ import annotations

from html import escape

from .forms import Params

_STYLE = "body{font-family:sans-serif;max-width:40em;margin:2em auto}"


def consent_page(action: str, params: Params, client_id: str, subject: str, resources: tuple[str, ...]) -> bytes:
    """A form that re-posts the authorization request with ``decision=approve`` or ``decision=deny``."""
    hidden = "".join(
        f'<input type="hidden" name="{escape(name)}" value="{escape(value)}">'
        for name, values in params.items()
        if name != "decision"
        for value in values
    )
    listed = "".join(f"<li><code>{escape(r)}</code></li>" for r in resources)
    return (
        f"<!doctype html><html><head><title>Authorize {escape(client_id)}</title><style>{_STYLE}</style></head>"
        f"<body><h1>Authorize <code>{escape(client_id)}</code></h1>"
        f"<p>as <b>{escape(subject)}</b> for:</p><ul>{listed}</ul>"
        f'<form method="post" action="{escape(action)}">{hidden}'
        '<button name="decision" value="approve">Approve</button> '
        '<button name="decision" value="deny">Deny</button></form></body></html>'
    ).encode()


def error_page(description: str) -> bytes:
    return (
        f"<!doctype html><html><head><title>Authorization request rejected</title><style>{_STYLE}</style>"
        f"</head><body><h1>Authorization request rejected</h1><p>{escape(description)}</p></body></html>"
    ).encode()
