"""``/hub/api/gpulab/jobs``: submit, list, read, cancel, re-run jobs (notebooks, scripts); logs and outputs.

Scopes: ``custom:gpulab:jobs`` for one's own jobs (every user holds
``custom:gpulab:jobs!user``), ``custom:gpulab:admin`` for everyone's. A job
that the caller may not see answers 404, exactly like a job that does not
exist, so ids of other users' jobs cannot be probed. See docs/jobs.md and
docs/jobs-openapi.yaml.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tornado import web

from hub_config.api.base import GPULabAPIHandler, ascii_id
from hub_config.config.scopes import ADMIN, JOBS
from hub_config.jobs.models import JobRecord
from hub_config.jobs.service import get_service
from spawner.admission import user_groups
from spawner.core.jobspec import RERUN_KEPT, STATES, JobSpecError

#: Largest submission body (parameters are limited separately, and more tightly).
MAX_SUBMIT_BYTES = 64 * 1024
#: A re-run's body names one choice.
MAX_RERUN_BYTES = 1024
#: Most log bytes one ``/logs`` call returns.
LOG_CHUNK = 256 * 1024


class JobsBase(GPULabAPIHandler):
    @property
    def jobs(self):
        return get_service(self.settings.get("config"))

    def caller_user(self):
        """The calling *user* (jobs are submitted by users, not services)."""
        user = self.current_user
        if not user:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        return user

    def require_any_jobs_scope(self) -> None:
        """403 unless the caller holds the jobs scope for itself, or is a gpulab admin."""
        user = self.caller_user()
        name = getattr(user, "name", "")
        if self.has_scope(ADMIN) or self.has_scope(JOBS, name) or self.has_scope(JOBS):
            return
        sub = (getattr(self, "parsed_scopes", {}) or {}).get(JOBS)
        if sub:  # a filtered jobs scope for other users (e.g. a service acting for them)
            return
        raise web.HTTPError(403, f"Action is not authorized with current scopes; requires {JOBS}")

    def may_see(self, rec: JobRecord) -> bool:
        return self.has_scope(ADMIN) or self.has_scope(JOBS, rec.user)

    def load(self, job_id: str) -> JobRecord:
        self.require_any_jobs_scope()
        number = ascii_id(job_id)
        rec = self.jobs.get_job(number) if number is not None else None
        if rec is None or not self.may_see(rec):
            raise web.HTTPError(404, f"no job {job_id[:20]}")
        return rec

    def submitting_user(self, what: str) -> Any:
        """The user submitting ``what`` (jobs, sweeps): a user's token holding the jobs scope for itself."""
        self.require_any_jobs_scope()
        user = self.current_user
        if getattr(user, "kind", "user") != "user":
            raise web.HTTPError(400, f"{what} are submitted with a user's token")
        if not self.has_scope(JOBS, user.name):
            raise web.HTTPError(403, f"Action is not authorized with current scopes; requires {JOBS}")
        return user

    def listed_user(self, user: str | None, what: str) -> str | None:
        """Whose ``what`` (jobs, sweeps) a list shows: an admin's ``?user=`` (``None``: everyone's); another
        user's only with the jobs scope for them; else the calling user's own."""
        if self.has_scope(ADMIN):
            return user  # everyone's, filtered as asked
        if user is not None:
            if not self.has_scope(JOBS, user):
                raise web.HTTPError(403, f"requires {ADMIN} to list another user's {what}")
            return user
        me = self.caller_name
        if getattr(self.current_user, "kind", "user") != "user" or not self.has_scope(JOBS, me):
            raise web.HTTPError(400, "name the user with ?user=NAME")
        return me

    def groups_of(self, user_name: str) -> list[str]:
        return user_groups(self.find_user(user_name))


class JobsHandler(JobsBase):
    async def get(self) -> None:
        self.require_any_jobs_scope()
        user = self.get_argument("user", None)
        team = self.get_argument("team", None)
        state = self.get_argument("state", None)
        for label, value in (("user", user), ("team", team)):
            if value is not None and (len(value) > 255 or not value):
                raise web.HTTPError(400, f"invalid {label}")
        if state is not None and state not in STATES:
            raise web.HTTPError(400, f"state must be one of {', '.join(STATES)}")
        user = self.listed_user(user, "jobs")
        records = self.jobs.list_jobs(user=user, team=team, state=state)
        self.write_json({"jobs": [r.to_json() for r in records]})

    async def post(self) -> None:
        user = self.submitting_user("jobs")
        body = self.read_json(MAX_SUBMIT_BYTES)
        try:
            rec, created = await self.jobs.create_job(user.name, user_groups(user), body)
        except JobSpecError as e:
            raise web.HTTPError(e.status, str(e)) from None
        self.write_json(rec.to_json(), 201 if created else 200)


class JobHandler(JobsBase):
    async def get(self, job_id: str) -> None:
        self.write_json(self.load(job_id).to_json())


class JobCancelHandler(JobsBase):
    async def post(self, job_id: str) -> None:
        rec = self.load(job_id)
        try:
            rec = await self.jobs.cancel(rec, self.caller_name)
        except JobSpecError as e:
            raise web.HTTPError(e.status, str(e)) from None
        self.write_json(rec.to_json())


class JobRerunHandler(JobsBase):
    async def post(self, job_id: str) -> None:
        """``{"notebook": "kept"}`` (the default, also for an empty body): the notebook exactly as the
        job ran it; ``{"notebook": "current"}``: the notebook as it is now."""
        rec = self.load(job_id)
        if self.caller_name != rec.user and not self.has_scope(ADMIN):
            raise web.HTTPError(403, "only the job's owner or an admin may re-run it")
        body = self.read_json(MAX_RERUN_BYTES) if self.request.body else {}
        unknown = sorted(str(k)[:40] for k in body if k != "notebook")
        if unknown:
            raise web.HTTPError(400, "unknown field(s): " + ", ".join(unknown[:5]) + "; a re-run takes only 'notebook'")
        try:
            new = await self.jobs.rerun(rec, self.groups_of(rec.user), body.get("notebook", RERUN_KEPT))
        except JobSpecError as e:
            raise web.HTTPError(e.status, str(e)) from None
        self.write_json(new.to_json(), 201)


class JobLogsHandler(JobsBase):
    async def get(self, job_id: str) -> None:
        rec = self.load(job_id)
        offset = self.int_argument("offset", 0)
        # A multi-node job's nodes each write a log; rank 0's is the job's.
        rank = self.int_argument("rank", 0, 0, max(0, rec.nodes - 1))
        try:
            # As the owner: one run of the mediator, awaited with its deadline (never blocking the hub).
            data, new_offset = await self.jobs.read_log(rec, offset, LOG_CHUNK, rank)
        except JobSpecError as e:
            raise web.HTTPError(e.status, str(e)) from None
        # Complete when the job is final and there is nothing more to read.
        complete = rec.state in ("succeeded", "failed", "cancelled", "timed-out") and len(data) < LOG_CHUNK
        self.write_json(
            {
                "text": data.decode("utf-8", errors="replace"),
                "offset": new_offset,
                "complete": complete,
                "state": rec.state,
            }
        )


class JobOutputHandler(JobsBase):
    async def get(self, job_id: str) -> None:
        rec = self.load(job_id)
        if not rec.output_path:
            raise web.HTTPError(404, f"job {rec.id} runs a script: it has no output notebook; its output is its log")
        try:
            data = await self.jobs.read_output(rec)
        except JobSpecError as e:
            raise web.HTTPError(e.status, str(e)) from None
        if data is None:
            raise web.HTTPError(404, f"job {rec.id} ({rec.state}) has no output notebook yet")
        # Checked off the event loop (up to c.GPULabJobs.max_output_bytes), then sent as it is.
        if not await asyncio.to_thread(is_json_object, data):
            raise web.HTTPError(409, "the output notebook is still being written, or is not a notebook; try again")
        self.set_header("Content-Type", "application/json")
        self.finish(data)


def is_json_object(data: bytes) -> bool:
    """Is ``data`` one JSON object as browsers parse it (no NaN or Infinity, any depth Python reads)?"""

    def refuse(name: str) -> Any:
        raise ValueError(name)

    try:
        return isinstance(json.loads(data, parse_constant=refuse), dict)
    except (ValueError, RecursionError):
        return False


handlers = [
    (r"/api/gpulab/jobs", JobsHandler),
    (r"/api/gpulab/jobs/([^/]+)", JobHandler),
    (r"/api/gpulab/jobs/([^/]+)/cancel", JobCancelHandler),
    (r"/api/gpulab/jobs/([^/]+)/rerun", JobRerunHandler),
    (r"/api/gpulab/jobs/([^/]+)/logs", JobLogsHandler),
    (r"/api/gpulab/jobs/([^/]+)/output", JobOutputHandler),
]
