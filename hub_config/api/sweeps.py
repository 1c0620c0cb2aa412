"""``/hub/api/gpulab/sweeps``: submit a parameter sweep in one request, read it, cancel it.

A sweep is a job's submission plus ``grid`` or ``runs``, ``max_parallel`` and ``objective``
(:mod:`spawner.core.sweeps`); each of its runs becomes a job of ``/hub/api/gpulab/jobs``
when the sweep's scheduler admits it (:mod:`hub_config.jobs.sweeps`). The scopes are the
jobs' (``custom:gpulab:jobs`` for one's own, ``custom:gpulab:admin`` for everyone's), and a
sweep the caller may not see answers 404, exactly like one that does not exist. See
docs/jobs.md and docs/jobs-openapi.yaml.
"""

from __future__ import annotations

from tornado import web

from hub_config.api.base import MAX_BODY_BYTES, ascii_id
from hub_config.api.jobs import JobsBase
from hub_config.config.scopes import ADMIN, JOBS
from hub_config.jobs.sweep_models import SweepRecord
from spawner.admission import user_groups
from spawner.core.jobspec import JobSpecError

#: Largest sweep submission: a job's body and a list of a few hundred runs' parameters.
MAX_SWEEP_BYTES = MAX_BODY_BYTES


class SweepsBase(JobsBase):
    @property
    def sweeps(self):
        return self.jobs.sweeps

    def load_sweep(self, sweep_id: str) -> SweepRecord:
        self.require_any_jobs_scope()
        number = ascii_id(sweep_id)
        rec = self.sweeps.get_sweep(number) if number is not None else None
        if rec is None or not (self.has_scope(ADMIN) or self.has_scope(JOBS, rec.user)):
            raise web.HTTPError(404, f"no sweep {sweep_id[:20]}")
        return rec


class SweepsHandler(SweepsBase):
    async def get(self) -> None:
        """The caller's sweeps (an admin: anyone's with ``?user=``), newest first, without their runs."""
        self.require_any_jobs_scope()
        user = self.get_argument("user", None)
        if user is not None and (not user or len(user) > 255):
            raise web.HTTPError(400, "invalid user")
        user = self.listed_user(user, "sweeps")
        records = self.sweeps.list_sweeps(user=user)
        self.write_json({"sweeps": self.sweeps.list_json(records)})

    async def post(self) -> None:
        user = self.submitting_user("sweeps")
        body = self.read_json(MAX_SWEEP_BYTES)
        try:
            rec, created = await self.sweeps.create_sweep(user.name, user_groups(user), body)
        except JobSpecError as e:
            raise web.HTTPError(e.status, str(e)) from None
        self.write_json(self.sweeps.to_json(rec), 201 if created else 200)


class SweepHandler(SweepsBase):
    async def get(self, sweep_id: str) -> None:
        """The sweep with every run: parameters, state, metrics, the best run by its objective."""
        self.write_json(self.sweeps.to_json(self.load_sweep(sweep_id)))


class SweepCancelHandler(SweepsBase):
    async def post(self, sweep_id: str) -> None:
        """Admit no more runs; cancel every run that has not finished."""
        rec = self.load_sweep(sweep_id)
        if self.caller_name != rec.user and not self.has_scope(ADMIN):
            raise web.HTTPError(403, "only the sweep's owner or an admin may cancel it")
        try:
            rec = await self.sweeps.cancel(rec, self.caller_name)
        except JobSpecError as e:
            raise web.HTTPError(e.status, str(e)) from None
        self.write_json(self.sweeps.to_json(rec))


handlers = [
    (r"/api/gpulab/sweeps", SweepsHandler),
    (r"/api/gpulab/sweeps/([^/]+)", SweepHandler),
    (r"/api/gpulab/sweeps/([^/]+)/cancel", SweepCancelHandler),
]
