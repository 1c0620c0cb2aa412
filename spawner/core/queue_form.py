"""The spawn page's queue: "Queue me" on a full profile, the caller's place in line, and the
script that follows it (pure HTML; the views come from the hub's queue runner)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from html import escape
from typing import Any

from .policy import ProfileChoice

QUEUE_CSS = """
<style>
.gpulab-queue { border: 1px solid #9ec5fe; background: #f1f6ff; border-radius: 4px; padding: .4em .7em; margin: 0 0 .6em 0; }
.gpulab-queue p { margin: .1em 0; }
.gpulab-queue .gpulab-queue-when { color: #555; font-size: .9em; }
.gpulab-queue-me { padding: 0 .45em; font-size: .95em; line-height: 1.35; vertical-align: baseline; }
.gpulab-right-size { color: #0a58ca; display: block; }
[data-bs-theme=dark] .gpulab-queue { background: #1c2533; border-color: #3d5a80; }
[data-bs-theme=dark] .gpulab-queue .gpulab-queue-when { color: #adb5bd; }
[data-bs-theme=dark] .gpulab-right-size { color: #6ea8fe; }
</style>
"""

#: Polls the caller's queue; when an entry of this page's server has started, says so, sends a
#: browser notification (if the user allowed them) and opens the server's progress page.
QUEUE_SCRIPT = """
<script>
(function () {
  var cfg = JSON.parse(document.getElementById("gpulab-queue-config").textContent);
  // The queue's buttons are type=button, never the form's first submit button (Enter in the
  // form must start, not queue). Each posts a form of its own, with the spawn form's XSRF
  // token (JupyterHub puts it in the spawn form's action URL) and the card's image choice.
  function post(url, fields) {
    var spawn = document.getElementById("spawn_form");
    var xsrf = spawn ? new URL(spawn.action, window.location.href).searchParams.get("_xsrf") : null;
    var f = document.createElement("form");
    f.method = "post";
    f.action = url;
    f.hidden = true;
    if (xsrf) { fields._xsrf = xsrf; }
    Object.keys(fields).forEach(function (k) {
      var input = document.createElement("input");
      input.type = "hidden";
      input.name = k;
      input.value = fields[k];
      f.appendChild(input);
    });
    document.body.appendChild(f);
    f.submit();
  }
  document.addEventListener("click", function (ev) {
    var b = ev.target.closest && ev.target.closest("button[data-gpulab-queue], button[data-gpulab-cancel]");
    if (!b) { return; }
    ev.preventDefault();
    b.disabled = true;
    if (b.dataset.gpulabCancel) {
      post(cfg.cancel, {cancel: b.dataset.gpulabCancel});
      return;
    }
    var choice = b.dataset.gpulabQueue;
    var fields = {queue: choice};
    var image = document.querySelector('[name="image-' + choice + '"], [name="profile-option-' + choice + '--image"]');
    if (image && image.value) { fields["image-" + choice] = image.value; }
    post(b.dataset.gpulabQueueUrl, fields);
  });
  var live = document.getElementById("gpulab-queue-live");
  var notify = document.getElementById("gpulab-queue-notify");
  if (notify && window.Notification) {
    if (Notification.permission === "granted") { notify.hidden = true; }
    notify.addEventListener("click", function (ev) {
      ev.preventDefault();
      Notification.requestPermission().then(function (p) {
        notify.hidden = p === "granted";
        if (p !== "granted") { live.textContent = "Notifications are blocked in this browser; this page will still tell you."; }
      });
    });
  } else if (notify) { notify.hidden = true; }
  function cookie(name) {
    var m = document.cookie.match("(?:^|; )" + name + "=([^;]*)");
    return m ? decodeURIComponent(m[1]) : "";
  }
  function poll() {
    fetch(cfg.api, {headers: {"X-XSRFToken": cookie("_xsrf")}, credentials: "same-origin"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (!data) { return; }
        var mine = data.entries.filter(function (e) { return e.server_name === cfg.server; });
        var started = mine.filter(function (e) { return e.state === "started" && cfg.waiting.indexOf(e.id) >= 0; })[0];
        if (started) {
          var text = "Your server is starting: " + started.display_name + " in team " + started.team + " is free now.";
          live.textContent = text;
          if (window.Notification && Notification.permission === "granted") { new Notification("gpulab", {body: text}); }
          window.location.assign(cfg.pending);
          return;
        }
        mine.forEach(function (e) {
          var line = document.getElementById("gpulab-queue-" + e.id + "-where");
          var when = document.getElementById("gpulab-queue-" + e.id + "-when");
          if (line && e.position_sentence) { line.textContent = e.position_sentence + "."; }
          if (when && e.prediction_sentence) { when.textContent = e.prediction_sentence + "."; }
        });
        setTimeout(poll, cfg.every_ms);
      })
      .catch(function () { setTimeout(poll, cfg.every_ms * 2); });
  }
  if (cfg.waiting.length) { setTimeout(poll, cfg.every_ms); }
})();
</script>
"""


def queueable(choice: ProfileChoice) -> bool:
    """May the user wait in line for this unavailable choice: is it full now, and could it ever
    fit (no larger than the team's burst limit and the per-user cap, and a server that has the model)?"""
    c = choice
    if c.available or not c.profile.is_gpu or c.blocked_by not in ("quota", "capacity"):
        return False
    milli = c.effective_milli or c.profile.gpu_milli
    cap = c.team.per_user_cap_milli
    if milli > c.team.burst_milli or (cap is not None and milli > cap):
        return False
    return not c.reason.startswith("this server has no ")


def queue_button_html(choice: ProfileChoice, queue_url: str) -> str:
    """ "Queue me" on a full profile's card: a button (never the spawn form's first submit button,
    so Enter still starts) whose click posts the choice to the queue (:data:`QUEUE_SCRIPT`)."""
    value = f"{choice.team.name}:{choice.profile.slug}"
    return (
        f'<button type="button" class="btn btn-outline-primary btn-sm gpulab-queue-me"'
        f' data-gpulab-queue-url="{escape(queue_url)}" data-gpulab-queue="{escape(value)}"'
        f' aria-label="Queue me for {escape(choice.profile.display_name)}'
        f' in team {escape(choice.team.name)}" title="Wait in line: your server starts by itself when this frees">'
        "Queue me</button>"
    )


def queue_panel_html(
    entries: Iterable[Mapping[str, Any]],
    *,
    server_name: str,
    cancel_url: str,
    api_url: str,
    pending_url: str,
    notice: str = "",
    poll_seconds: float = 5.0,
) -> str:
    """The caller's queue entries for this page's server, at the top of the spawn page."""
    mine = [e for e in entries if e.get("server_name") == server_name]
    waiting = [e for e in mine if e.get("state") in ("waiting", "starting")]
    parts = [QUEUE_CSS]
    if notice:
        parts.append(f'<p class="gpulab-reason" id="gpulab-queue-notice" role="status">{escape(notice)}</p>')
    for e in waiting:
        eid = int(e["id"])
        where = e.get("position_sentence") or f"Starting {e.get('display_name', '')} in team {e.get('team', '')}"
        when = e.get("prediction_sentence") or ""
        parts.append(
            f'<div class="gpulab-queue" id="gpulab-queue-{eid}" data-entry="{eid}">'
            f'<p><strong id="gpulab-queue-{eid}-where">{escape(where)}.</strong></p>'
            f'<p class="gpulab-queue-when" id="gpulab-queue-{eid}-when">{escape(when)}{"." if when else ""}</p>'
            '<p class="gpulab-queue-when">Keep this page open to go to your server when it starts, or come back later.</p>'
            f'<button type="button" class="btn btn-secondary btn-sm" data-gpulab-cancel="{eid}"'
            f' id="gpulab-queue-{eid}-cancel">Leave the queue</button> '
            '<button type="button" class="btn btn-link btn-sm" id="gpulab-queue-notify">Notify me when it starts</button>'
            "</div>"
        )
    for e in mine:
        if e.get("state") == "failed":
            parts.append(
                f'<p class="gpulab-reason" role="status">Your queued {escape(str(e.get("display_name", "")))} '
                f"did not start: {escape(str(e.get('reason', '')))}</p>"
            )
    parts.append('<p class="gpulab-detail" id="gpulab-queue-live" role="status" aria-live="polite"></p>')
    config = {
        "api": api_url,
        "cancel": cancel_url,
        "server": server_name,
        "pending": pending_url,
        "waiting": [int(e["id"]) for e in waiting],
        "every_ms": int(poll_seconds * 1000),
    }
    # JSON in a script element: "</" is escaped so no value can close the element.
    text = json.dumps(config).replace("</", "<\\/")
    parts.append(f'<script type="application/json" id="gpulab-queue-config">{text}</script>')
    parts.append(QUEUE_SCRIPT)
    return "\n".join(parts)
