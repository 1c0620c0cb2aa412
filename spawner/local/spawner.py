"""The single-server spawners: JupyterHub's local process spawners + the GPU core.

``GPULocalSpawner`` (``gpu-local``, the embedded default when the hub runs as root or
has the sudoers rule) runs each server as the user's own system account (``jupyter-<name>``,
created on first spawn, home 0700: :mod:`spawner.local.accounts`), like
``LocalProcessSpawner`` with TLJH's account creation, or sudospawner for a hub that is not
root. ``GPUSimpleLocalSpawner`` (``gpu-simple-local``) runs every server as the hub's own
account with a home per user, like ``SimpleLocalProcessSpawner``: users are not isolated,
so the embedded hub uses it only when it cannot switch users, and says so. Both:

- offer the profiles of the user's teams with live availability;
- validate the choice again on the server and reserve quota in the shared
  ledger before anything starts;
- place the request on physical devices (best fit, never above one GPU per
  device) and start the server with ``CUDA_VISIBLE_DEVICES`` and variables
  that tell the user's code its share;
- free the share at once when the server stops or dies, and re-adopt it from
  saved state after a hub restart.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from jupyterhub.spawner import SimpleLocalProcessSpawner, SpawnException
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from traitlets import Bool, default
from traitlets.config import LoggingConfigurable

from spawner.admission import Admission, policy_refusal, refusal, user_groups
from spawner.core.env import gpu_env
from spawner.core.form import find_choice, options_from_formdata, refusal_sentence, render_options_form
from spawner.core.grant import STATE_KEY, GrantedShare
from spawner.core.idle import idle_policy_text
from spawner.core.ledger import Workload, notebook_key
from spawner.core.limits import LimitDefaults, WorkloadLimits, workload_limits
from spawner.core.packer import DevicePacker, Placement
from spawner.core.policy import (
    Capacity,
    PolicyError,
    ProfileChoice,
    SpawnRequest,
    choices_for_user,
    device_capacity,
    resolve_request,
    what_to_do,
)
from spawner.core.profile_facts import device_memory, profile_facts
from spawner.core.progress import setup_messages
from spawner.core.units import format_gpus
from spawner.queue_page import queue_form_parts
from spawner.runtime import SINGLE_SERVER, GPULabRuntime, get_runtime

from .account_spawner import AccountProcessSpawner
from .confinement import UserLimits
from .devices import placed_minors
from .inventory import ensure_packer

#: Spawner-state key of the address a started server listens on (:meth:`GPULocalMixin.get_url`).
URL_STATE_KEY = "gpulab_url"


#: The choice a refused spawn posted, per user: JupyterHub renders the form again
#: (from the user's default spawner) right after the refusal, and it stays selected.
_kept_choices: dict[str, str] = {}


#: Spawner traits a profile sets (same names on ``Profile``).
_PROFILE_LIMIT_TRAITS = ("cpu_guarantee", "cpu_limit", "mem_guarantee", "mem_limit")


if TYPE_CHECKING:
    # The mixin always sits in front of a JupyterHub Spawner (user, name, hub, get_env ...).
    from jupyterhub.spawner import Spawner as _SpawnerBase
else:
    _SpawnerBase = LoggingConfigurable


class GPULocalMixin(_SpawnerBase):
    """GPU profiles, quota and device placement for local-process spawners."""

    #: What this spawner is (:func:`spawner.runtime.spawner_facts`).
    gpulab_platform = SINGLE_SERVER

    #: What this server was granted, saved in the hub's spawner state (``state["gpulab"]``).
    _granted: GrantedShare | None = None
    #: Where the started server listens (``state["gpulab_url"]``), saved before it answers.
    _started_url: str = ""
    #: cpu/mem traits as configured, before any profile set them.
    _configured_limits: dict[str, Any] | None = None
    #: This named server's record was created by a visit of its spawn page and never ran.
    _fresh_record: bool = False
    #: start() refused the request (quota, capacity, options): JupyterHub stops the server next.
    _refused_start: bool = False
    #: The memory, CPU and process limits of the server being started (profile, team, defaults).
    _workload_limits: WorkloadLimits | None = None

    def runs_as_words(self) -> str:  # the process spawner that comes after the mixin says it
        """Whose account the server runs as, in words for the progress page."""
        words = getattr(super(), "runs_as_words", None)
        return words() if callable(words) else "as an account the hub does not name"

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        orm = kwargs.get("orm_spawner")
        self._fresh_record = bool(self.name) and orm is not None and orm.started is None and orm.last_activity is None

    allow_root_when_root = Bool(
        True,
        config=True,
        help="""Pass `--allow-root` to the single-user server when (and only when)
        the hub runs as root; jupyter-server refuses to start as root otherwise.""",
    )

    # -- runtime ------------------------------------------------------------

    @property
    def gpulab(self) -> GPULabRuntime:
        runtime = get_runtime(parent=self)
        if runtime.packer is None:
            with runtime.lock:
                if runtime.packer is None:
                    self._init_packer(runtime)
        return runtime

    def _init_packer(self, runtime: GPULabRuntime) -> None:
        ensure_packer(runtime, self.log)

    @property
    def packer(self) -> DevicePacker:
        """The runtime's device packer (created with the runtime: never ``None`` here)."""
        return ensure_packer(self.gpulab, self.log)

    def _groups(self) -> list[str]:
        return user_groups(self.user)

    @property
    def admission(self) -> Admission:
        """This server's way through the ledger (resolve, reserve, confirm, release, remember)."""
        return Admission(self.gpulab, self.user.name, self._groups(), self._key, self.log)

    @property
    def _key(self) -> str:
        return notebook_key(self.user.name, self.name or "")

    # -- the spawn page -----------------------------------------------------

    def _capacity(self, profile) -> Capacity:
        return device_capacity(self.packer, profile)

    def inventory_note(self) -> tuple[str, bool]:
        runtime = self.gpulab
        packer = self.packer
        counts: dict[str, int] = {}
        for d in packer.devices.values():
            counts[d.model] = counts.get(d.model, 0) + 1
        what = ", ".join(f"{n} × {m}" for m, n in counts.items()) or "no GPUs"
        if runtime.inventory_source == "nvml":
            return f"This server: {what} (detected by NVML).", False
        return f"This server: {what} declared in config — not detected (no NVIDIA driver found).", True

    @default("options_form")
    def _default_options_form(self):
        return self._render_options_form

    def _render_options_form(self, spawner=None) -> str:
        runtime = self.gpulab
        choices = choices_for_user(runtime.catalog, runtime.ledger, self.user.name, self._groups(), self._capacity)
        note, declared = self.inventory_note()
        # Showing the form starts nothing: the record JupyterHub made to show it goes again.
        self._forget_unstarted_record()
        refused = _kept_choices.pop(self.user.name, "")
        selected = self._last_choice_value()
        admin = bool(getattr(self.user, "admin", False))
        return render_options_form(
            choices,
            note,
            declared,
            self.reclaim_notice(),
            selected=selected,
            refused=refused,
            start_again_url=self.start_again_url(selected) if selected else "",
            idle=self.gpulab.idle_facts,
            admin_contact=runtime.admin_contact,
            admin_page_url=f"{self.hub.base_url}gpulab/admin" if admin and not choices else "",
            gives=self._profile_gives,
            **self.queue_form_parts(),
        )

    def queue_form_parts(self) -> dict[str, Any]:
        """The spawn form's queue and right-size lines (:func:`spawner.queue_page.queue_form_parts`)."""
        return queue_form_parts(self.gpulab, self.user.name, self.name or "", self.hub.base_url, self.log)

    def _profile_gives(self, choice: ProfileChoice) -> list[str]:
        """What a profile gives here: its share of this server's device memory, the CPU and memory
        its server runs under (the profile's, else the team's cap and the hub's defaults)."""
        p = choice.profile
        limits = workload_limits(p, choice.team, self.limit_defaults())
        devices = [(d.model, d.memory_mib) for d in self.packer.devices.values()]
        memory = device_memory(p.gpu_model, devices, self.gpulab.catalog.inventory)
        milli = choice.effective_milli or p.gpu_milli
        return profile_facts(p, milli, memory, cpu_limit=limits.cpu, mem_limit=limits.memory)

    def _last_choice_value(self) -> str:
        """``team:profile`` this user last started ('' if none, or unreadable: the form renders anyway)."""
        try:
            last = self.gpulab.last_choice(self.user.name)
        except Exception as e:
            self.log.warning("gpulab: cannot read the last choice of %s: %s", self.user.name, e)
            return ""
        return f"{last['team']}:{last['profile']}" if last else ""

    def start_again_url(self, value: str) -> str:
        """JupyterHub's spawn URL for this server with ``team:profile`` in the query (one click)."""

        path = f"{self.hub.base_url}spawn/{quote(self.user.name, safe='')}"
        if self.name:
            path += "/" + quote(self.name, safe="")
        return f"{path}?opt-choice={quote(value, safe='')}"

    def reclaim_notice(self) -> str:
        """ "Your GPU was reclaimed at HH:MM ..." when the idle culler ended this server's last session."""
        return get_runtime(parent=self).reclaim_notice(self)

    def options_from_form(self, formdata: dict[str, list[str]]) -> dict[str, str]:
        posted = formdata.get("choice") or []
        try:
            options = options_from_formdata(formdata)
            self._resolve(options, check_now=True)
        except PolicyError as e:
            self._forget_unstarted_record()
            if len(posted) == 1 and isinstance(posted[0], str) and len(posted[0]) <= 256:
                _kept_choices[self.user.name] = posted[0]
            raise policy_refusal(e, self.refusal_text(posted[0] if len(posted) == 1 else "", str(e))) from None
        return options

    def refusal_text(self, value: str, reason: str) -> str:
        """The sentence the spawn page shows for a refused choice, with what to do about it."""
        runtime = self.gpulab
        choices = choices_for_user(runtime.catalog, runtime.ledger, self.user.name, self._groups(), self._capacity)
        choice: ProfileChoice | None = find_choice(choices, value) if isinstance(value, str) else None
        if choice is None:
            return refusal_sentence("Your server", reason)
        if choice.available:  # refused for a reason the live view does not show (e.g. image): no advice
            return refusal_sentence(choice.profile.display_name, reason)
        return refusal_sentence(choice.profile.display_name, reason, what_to_do(choice, choices, runtime.admin_contact))

    # -- named-server records -----------------------------------------------

    def _forget_unstarted_record(self) -> None:
        """Remove this named server's record if it never ran.

        JupyterHub stores a record on every visit of ``/hub/spawn/<user>/<name>``
        and keeps it after a refused spawn; left behind, such records fill the
        home page and count towards ``named_server_limit_per_user``. Only a
        record that never ran is removed: a stopped server the user started
        before stays.
        """
        user = getattr(self, "user", None)
        orm = getattr(self, "orm_spawner", None)
        if (
            not self._fresh_record
            or self.active
            or orm is None
            or orm.server is not None
            or user is None
            or user.spawners.get(self.name) is not self
        ):
            return
        user.spawners.pop(self.name, None)
        user.db.delete(orm)
        user.db.commit()
        self.log.info("gpulab: removed the record of named server %s/%s, which never ran", user.name, self.name)

    def run_post_stop_hook(self):
        """After JupyterHub stopped a server that was refused in :meth:`start`, forget its record.

        This is the last step of a failed spawn; the record goes once the
        failure has been answered, before any other request can reuse it.
        """
        result = super().run_post_stop_hook()
        if self._refused_start:
            self._refused_start = False
            asyncio.get_running_loop().call_soon(self._forget_unstarted_record)
        return result

    def _resolve(self, options: dict[str, Any], check_now: bool = False) -> SpawnRequest:
        runtime = self.gpulab
        request = resolve_request(runtime.catalog, self.user.name, self._groups(), options)
        full = runtime.disk_full()
        if full is not None:  # before anything is reserved or written
            raise PolicyError(full, 507)
        if check_now:
            # Early feedback on the form; start() decides for real, atomically.
            decision = runtime.ledger.admit(
                request.team.name,
                self.user.name,
                request.milli,
                may_burst=request.profile.priority_class.may_burst,
                profile=request.profile.slug,
            )
            if not decision.allowed:
                raise PolicyError(decision.reason, 403)
            if request.milli:
                cap = self._capacity(request.profile)
                if not cap.ok:
                    raise PolicyError(cap.reason, 409)
        return request

    # -- start / stop -------------------------------------------------------

    async def start(self):
        runtime = self.gpulab
        admission = self.admission
        try:
            request = self._resolve(dict(self.user_options or {}))
        except PolicyError as e:
            self._refused()
            raise policy_refusal(e) from None
        key = self._key
        profile = request.profile
        try:
            decision = admission.reserve(request, request.milli, lambda r: refusal_sentence(profile.display_name, r))
        except SpawnException:
            self._refused()
            raise
        placement: Placement | None = None
        if request.milli:
            models = {profile.gpu_model} if profile.gpu_model else None

            def place() -> Placement | None:
                with runtime.lock:
                    return self.packer.place(key, request.milli, models)

            placement = await admission.placed(place)
            if placement is None:
                admission.release()
                self._refused()
                reason = self._capacity(profile).reason or "no free GPU fits this profile"
                raise refusal(refusal_sentence(profile.display_name, reason), 409, "capacity")
        # JupyterHub passes these to the server as MEM_LIMIT, CPU_LIMIT, ... (what
        # jupyter-resource-usage shows); a local process is not confined by them.
        # Start from the configured values, so a previous spawn's profile never leaks.
        if self._configured_limits is None:
            self._configured_limits = {t: getattr(self, t) for t in _PROFILE_LIMIT_TRAITS}
        for trait in _PROFILE_LIMIT_TRAITS:
            value = getattr(profile, trait)
            setattr(self, trait, self._configured_limits[trait] if value is None else value)
        # What the server's cgroup enforces (the team may cap the profile): MEM_LIMIT says the same.
        self._workload_limits = workload_limits(profile, request.team, self.limit_defaults())
        if self._workload_limits.memory is not None:
            self.mem_limit = self._workload_limits.memory
        if self._workload_limits.cpu is not None:
            self.cpu_limit = self._workload_limits.cpu
        self._granted = GrantedShare(
            team=request.team.name,
            profile=profile.slug,
            image=request.image.slug if request.image else "",
            milli=request.milli,
            over_quota=decision.over_quota,
            shares=tuple((d, m) for d, m in placement.shares) if placement else (),
        )
        self.log.info(
            "gpulab: %s admitted in team %s: %s GPU (%s) on devices %s",
            key,
            request.team.name,
            format_gpus(request.milli),
            decision.quota_label,
            placement.device_indices if placement else "()",
        )
        try:
            result = await super().start()
        except BaseException:
            self._release()
            raise
        admission.confirm()
        self._fresh_record = False
        self._save_started_state(result)
        admission.remember_choice(request)
        await self._wait_until_answering(result)
        return result

    def _save_started_state(self, address: Any) -> None:
        """Store the started process (pid, address, devices) in the hub's database at once.

        JupyterHub saves a spawner's state only when ``start()`` has returned, which
        here is once the server answers (seconds later). A hub that dies in between
        would find a server record without a pid after its restart, call the server
        gone and free its share while the process still runs on that GPU. Saved
        now, the restarted hub re-adopts it like any running server and finds it
        at the saved address (:meth:`get_url`).
        """
        if isinstance(address, tuple) and len(address) == 2:
            ip, port = address
            self._started_url = f"http://{ip or '127.0.0.1'}:{int(port)}"
        orm = getattr(self, "orm_spawner", None)
        db = getattr(getattr(self, "user", None), "db", None)
        if orm is None or db is None:
            return
        try:
            orm.state = self.get_state()
            db.commit()
        except Exception as e:  # JupyterHub saves it again when the spawn returns
            db.rollback()
            self.log.warning("gpulab: cannot save the state of %s before it answers: %s", self._key, e)

    async def get_url(self) -> str:
        """The server's URL from its saved address (JupyterHub asks after a restart).

        A hub that restarted while this server was still starting knows its record,
        not where it listens (the address is stored when the spawn returns); the
        address saved at start (:meth:`_save_started_state`) says.
        """
        if self._started_url and self.server is not None:
            return self._started_url + self.server.base_url
        return await super().get_url()

    async def _wait_until_answering(self, address: Any) -> None:
        """Return once the new server answers HTTP (or has died, or ``http_timeout`` passed).

        JupyterHub then checks the server itself, with an exponential back-off (0.2,
        0.4, 0.8 … s, jittered): a server that comes up just after one of its checks
        waits, measured here, up to 1-2 s for the next. Asking every 50 ms from
        here makes the hub's first check succeed. Any answer counts (the server's
        own authentication may refuse this request); a refused connection does not.
        """
        if not (isinstance(address, tuple) and len(address) == 2):
            return
        ip, port = address
        url = f"http://{ip or '127.0.0.1'}:{port}{self.server.base_url if self.server else '/'}api"
        client = AsyncHTTPClient()
        deadline = asyncio.get_running_loop().time() + self.http_timeout
        while asyncio.get_running_loop().time() < deadline:
            try:
                await client.fetch(url, request_timeout=2, raise_error=False)
                return
            except (OSError, HTTPClientError):
                pass  # not listening yet (refused), or not answering yet (timed out)
            if await self.poll() is not None:
                return  # it died: JupyterHub's own check reports that
            await asyncio.sleep(0.05)

    async def progress(self):
        """What is being set up, in words: quota decision, devices, the account it runs as.

        JupyterHub's spawn-pending page shows these while the server starts;
        they come from what :meth:`start` decided, never from the form.
        """
        for _ in range(100):  # the page may connect before start() has placed the request
            if self._granted or self.pending != "spawn":
                break
            await asyncio.sleep(0.05)
        granted = self._granted
        runtime = self.gpulab
        team = runtime.catalog.team(granted.team) if granted else None
        profile = runtime.catalog.profile(granted.profile) if granted else None
        if granted is None or team is None or profile is None:
            yield {"progress": 10, "message": "Starting your server"}
            return
        messages = setup_messages(
            profile,
            team,
            granted.milli,
            granted.over_quota,
            granted.shares or (),
            self.packer.devices,
            self.runs_as_words(),
            idle_policy_text(profile, team, runtime.idle_facts),
        )
        for i, message in enumerate(messages):
            yield {"progress": 20 + 60 * i // len(messages), "message": message}

    def _refused(self) -> None:
        self._refused_start = True

    def _release(self) -> None:
        runtime = self.gpulab
        key = self._key
        with runtime.lock:
            self.packer.release(key)
        self.admission.release()
        self._granted = None

    async def poll(self):
        status = await super().poll()
        if status is not None and self._granted:
            self._release()
        return status

    async def stop(self, now: bool = False):
        try:
            await super().stop(now=now)
        finally:
            self._release()

    # -- limits -------------------------------------------------------------

    def limit_defaults(self) -> LimitDefaults:
        """The hub's defaults for what the profile and team leave open (``c.UserLimits``)."""
        return UserLimits(parent=self).defaults()

    def workload_limits(self) -> WorkloadLimits:
        if self._workload_limits is not None:
            return self._workload_limits
        d = self.limit_defaults()
        return WorkloadLimits(memory=d.memory, cpu=d.cpu, processes=d.processes)

    def placed_gpus(self) -> set[int]:
        return placed_minors(self._granted.devices if self._granted else (), self.packer.devices)

    # -- environment --------------------------------------------------------

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        env.update(self.gpu_env())
        return env

    def gpu_env(self) -> dict[str, str]:
        """Variables that tell the user's code which GPUs it has and its share."""
        granted = self._granted
        if not granted:
            return {}
        return gpu_env(
            granted.team, granted.profile, granted.milli, granted.over_quota, granted.shares or (), self.packer.devices
        )

    def runs_as_root(self) -> bool:
        """Will the single-user server's process be root?"""
        return hasattr(os, "geteuid") and os.geteuid() == 0

    def get_args(self) -> list[str]:
        args = super().get_args()
        if self.allow_root_when_root and self.runs_as_root():
            args.append("--allow-root")
        return args

    # -- hub restarts -------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self._granted:
            state[STATE_KEY] = self._granted.to_json()
        if self._started_url:
            state[URL_STATE_KEY] = self._started_url
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        url = state.get(URL_STATE_KEY)
        self._started_url = url if isinstance(url, str) and url.startswith("http://") else ""
        saved = GrantedShare.from_state(state)
        if saved is None or not state.get("pid"):
            return
        # A server that was running before the hub restarted: count it again.
        runtime = self.gpulab
        key = self._key
        runtime.ledger.adopt(
            Workload(
                key,
                saved.team,
                self.user.name,
                saved.milli,
                saved.profile,
                "notebook",
                saved.over_quota,
            )
        )
        if saved.shares:
            with runtime.lock:
                try:
                    self.packer.adopt(key, saved.shares)
                except Exception as e:
                    self.log.error("gpulab: cannot re-adopt devices of %s: %s", key, e)
        self._granted = saved
        self.log.info("gpulab: re-adopted %s (%s GPU in team %s)", key, format_gpus(saved.milli), saved.team)

    def clear_state(self) -> None:
        super().clear_state()
        self._started_url = ""


class GPULocalSpawner(GPULocalMixin, AccountProcessSpawner):
    """Local processes as each user's own system account, with GPU profiles.

    The account comes from ``c.UserAccounts`` (prefix, home root, creation,
    and how the hub switches to it: as root, or through sudo).
    """

    #: Each server runs as its user's own system account (and so do the user's jobs).
    gpulab_user_accounts = True

    def runs_as_root(self) -> bool:
        return self.account.uid == 0


class GPUSimpleLocalSpawner(GPULocalMixin, SimpleLocalProcessSpawner):
    """All servers as the hub's account (one-box demo / lab), with GPU profiles."""

    def runs_as_words(self) -> str:
        """Whose account the server runs as, for the progress page (GPULocalSpawner's is
        AccountProcessSpawner's: "as system account jupyter-alice")."""
        return "as the hub's own account"
