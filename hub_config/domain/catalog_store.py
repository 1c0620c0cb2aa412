"""The edited catalog and the admin audit log, kept in gpulab's database.

The config file (``c.GPULab.catalog_file`` / ``c.GPULab.teams`` ...) seeds the
catalog on first run. Once an admin edits teams or profiles in the hub, the
database copy wins at every later start (``c.GPULabCatalogStore.source =
"database"``, the default), and a warning is logged when the file has changed
since. GitOps users who want the file to stay the single source set
``source = "file"``: the file is applied at every start and the admin API
refuses edits. ``reseed_from_file = True`` replaces the stored catalog with the
file's once (audited), then carries on as ``database``.

Every stored version goes through :func:`spawner.core.catalog.catalog_from_dict`,
the same validation as the config file.
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, DateTime, Integer, String, Text, select
from sqlalchemy.orm import Mapped, Session, mapped_column, sessionmaker
from traitlets import Bool, CaselessStrEnum
from traitlets.config import Configurable

from hub_config.storage.db import Base, iso, utcnow
from spawner.core.catalog import Catalog, catalog_from_dict
from spawner.core.catalog.write import catalog_to_dict

log = logging.getLogger("gpulab.catalog_store")

#: Actor name used for changes that come from the config file.
CONFIG_FILE_ACTOR = "config-file"


class GPULabCatalogStore(Configurable):
    """Which wins at start-up: the config file or the catalog edited in the hub."""

    source = CaselessStrEnum(
        ["database", "file"],
        default_value="database",
        config=True,
        help="""`database` (default): the config file seeds the catalog on first run
        (and again at start while no admin has edited it); once an admin edits teams
        or profiles in the hub, the stored catalog wins and a changed file only logs
        a warning. `file`: the config file is applied at every start (audited when
        it differs) and the admin API refuses edits (GitOps).""",
    )
    reseed_from_file = Bool(
        False,
        config=True,
        help="""Replace the stored catalog with the config file's at the next start
        (written to the audit log), then keep going in `database` mode. Remove the
        setting again after the restart.""",
    )


class StoredCatalog(Base):
    """The one current catalog (row id 1), as the dict the config file would hold."""

    __tablename__ = "gpulab_catalog"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[str] = mapped_column(Text)
    #: sha256 of the config file's catalog when it last seeded this row.
    file_digest: Mapped[str] = mapped_column(String(64))
    #: An admin has edited the catalog since the last seed from the file.
    edited: Mapped[bool] = mapped_column(Boolean, default=False)
    version: Mapped[int] = mapped_column(Integer, default=1)
    updated_at: Mapped[datetime] = mapped_column(DateTime)
    updated_by: Mapped[str] = mapped_column(String(255))


def add_audit_entry(s: Session, actor: str, action: str, target: str, old: Any, new: Any) -> None:
    """One audit log entry (``old`` -> ``new`` as JSON), in the caller's transaction."""
    s.add(
        AuditEntry(
            at=utcnow(),
            actor=actor,
            action=action,
            target=target,
            old=json.dumps(old, sort_keys=True) if old is not None else None,
            new=json.dumps(new, sort_keys=True) if new is not None else None,
        )
    )


class AuditEntry(Base):
    """One change: who, when, what, old -> new."""

    __tablename__ = "gpulab_audit"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime, index=True)
    actor: Mapped[str] = mapped_column(String(255))
    #: ``team.create``, ``team.update``, ``team.rename``, ``team.delete``,
    #: ``profile.create``, ``profile.update``, ``profile.retire``,
    #: ``profile.restore``, ``prices.update``, ``catalog.seed``, ``catalog.reseed``.
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(255))
    old: Mapped[str | None] = mapped_column(Text, nullable=True)
    new: Mapped[str | None] = mapped_column(Text, nullable=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": iso(self.at),
            "actor": self.actor,
            "action": self.action,
            "target": self.target,
            "old": json.loads(self.old) if self.old else None,
            "new": json.loads(self.new) if self.new else None,
        }


def digest(catalog: Catalog) -> str:
    return hashlib.sha256(json.dumps(catalog_to_dict(catalog), sort_keys=True).encode()).hexdigest()


class StaleCatalogError(RuntimeError):
    """Someone else saved a newer catalog first (another hub replica)."""


class CatalogStore:
    """Reads and writes the stored catalog and the audit log."""

    def __init__(self, sessions: sessionmaker[Session], settings: GPULabCatalogStore | None = None):
        self.sessions = sessions
        self.settings = settings or GPULabCatalogStore()

    @property
    def read_only(self) -> bool:
        return self.settings.source == "file"

    def row(self) -> StoredCatalog | None:
        with self.sessions() as s:
            return s.get(StoredCatalog, 1)

    def stored_catalog(self) -> Catalog | None:
        row = self.row()
        if row is None:
            return None
        return catalog_from_dict(json.loads(row.data), "gpulab database (table gpulab_catalog)")

    def _write(
        self,
        s: Session,
        catalog: Catalog,
        *,
        actor: str,
        edited: bool,
        file_digest: str | None = None,
        expect_version: int | None = None,
    ) -> StoredCatalog:
        row = s.get(StoredCatalog, 1)
        now = utcnow()
        data = json.dumps(catalog_to_dict(catalog), sort_keys=True)
        if row is None:
            row = StoredCatalog(
                id=1,
                data=data,
                file_digest=file_digest or "",
                edited=edited,
                version=1,
                updated_at=now,
                updated_by=actor,
            )
            s.add(row)
        else:
            if expect_version is not None and row.version != expect_version:
                raise StaleCatalogError(
                    f"the catalog changed meanwhile (version {row.version}, "
                    f"expected {expect_version}); reload and try again"
                )
            row.data = data
            row.version += 1
            row.edited = edited
            row.updated_at = now
            row.updated_by = actor
            if file_digest is not None:
                row.file_digest = file_digest
        return row

    def audit(self, s: Session, actor: str, action: str, target: str, old: Any, new: Any) -> None:
        add_audit_entry(s, actor, action, target, old, new)

    def seed(self, catalog: Catalog, action: str = "catalog.seed") -> None:
        """Store the config file's catalog (first run, or a re-seed)."""
        with self.sessions.begin() as s:
            row = s.get(StoredCatalog, 1)
            old = json.loads(row.data) if row is not None else None
            self._write(s, catalog, actor=CONFIG_FILE_ACTOR, edited=False, file_digest=digest(catalog))
            self.audit(s, CONFIG_FILE_ACTOR, action, "catalog", old, catalog_to_dict(catalog))

    def save(
        self, catalog: Catalog, *, actor: str, action: str, target: str, old: Any, new: Any, version: int | None = None
    ) -> int:
        """Store an admin's edit and its audit entry in one transaction; returns the new version."""
        with self.sessions.begin() as s:
            row = self._write(s, catalog, actor=actor, edited=True, expect_version=version)
            self.audit(s, actor, action, target, old, new)
            return row.version

    def entries(
        self, *, limit: int = 100, offset: int = 0, target: str | None = None, since: datetime | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        from sqlalchemy import func

        with self.sessions() as s:
            q = select(AuditEntry)
            cq = select(func.count(AuditEntry.id))
            if target:
                q = q.where(AuditEntry.target == target)
                cq = cq.where(AuditEntry.target == target)
            if since is not None:
                q = q.where(AuditEntry.at >= since)
                cq = cq.where(AuditEntry.at >= since)
            rows = s.scalars(q.order_by(AuditEntry.id.desc()).limit(limit).offset(offset)).all()
            return [r.to_dict() for r in rows], s.scalar(cq) or 0


def load_at_start(store: CatalogStore, file_catalog: Catalog) -> Catalog:
    """Decide which catalog the hub starts with (see the module docstring)."""
    row = store.row()
    file_digest = digest(file_catalog)
    if row is None:
        store.seed(file_catalog)
        log.info("gpulab: seeded the catalog in gpulab's database from the config file")
        return file_catalog
    if store.settings.source == "file" or store.settings.reseed_from_file:
        if row.file_digest != file_digest or row.edited:
            store.seed(file_catalog, action="catalog.reseed")
            log.warning(
                "gpulab: replaced the stored catalog with the config file's (%s)",
                "source = 'file'" if store.read_only else "reseed_from_file = True",
            )
        return file_catalog
    if not row.edited:
        if row.file_digest != file_digest:
            store.seed(file_catalog)
            log.info("gpulab: config file changed and no admin edits exist: re-seeded from the file")
        return file_catalog
    stored = store.stored_catalog()
    assert stored is not None
    if row.file_digest != file_digest:
        log.warning(
            "gpulab: the config file's teams/profiles changed since they seeded the database, but an "
            "admin edited the catalog in the hub (last by %s at %s): the database wins. Set "
            "c.GPULabCatalogStore.reseed_from_file = True once to start again from the file.",
            row.updated_by,
            iso(row.updated_at),
        )
    else:
        log.info("gpulab: using the catalog edited in the hub (version %d, by %s)", row.version, row.updated_by)
    return stored
