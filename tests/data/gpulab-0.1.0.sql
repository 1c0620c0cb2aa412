BEGIN TRANSACTION;
CREATE TABLE gpulab_audit (
	id INTEGER NOT NULL, 
	at DATETIME NOT NULL, 
	actor VARCHAR(255) NOT NULL, 
	action VARCHAR(64) NOT NULL, 
	target VARCHAR(255) NOT NULL, 
	old TEXT, 
	new TEXT, 
	PRIMARY KEY (id)
);
INSERT INTO "gpulab_audit" VALUES(1,'2026-06-01 09:00:00.000000','admin','team.update','vision','{"burst": 1}','{"burst": 2}');
CREATE TABLE gpulab_catalog (
	id INTEGER NOT NULL, 
	data TEXT NOT NULL, 
	file_digest VARCHAR(64) NOT NULL, 
	edited BOOLEAN NOT NULL, 
	version INTEGER NOT NULL, 
	updated_at DATETIME NOT NULL, 
	updated_by VARCHAR(255) NOT NULL, 
	PRIMARY KEY (id)
);
INSERT INTO "gpulab_catalog" VALUES(1,'{"teams": [{"name": "vision", "users": ["alice"], "guarantee": 1, "burst": 2}], "profiles": [{"slug": "half", "gpus": 0.5}]}','0000000000000000000000000000000000000000000000000000000000000000',1,3,'2026-06-01 09:00:00.000000','admin');
CREATE TABLE gpulab_idle_events (
	id INTEGER NOT NULL, 
	at FLOAT NOT NULL, 
	kind VARCHAR(16) NOT NULL, 
	user VARCHAR(255) NOT NULL, 
	server VARCHAR(255) NOT NULL, 
	team VARCHAR(255) NOT NULL, 
	profile VARCHAR(255) NOT NULL, 
	gpu_milli INTEGER NOT NULL, 
	reason TEXT NOT NULL, 
	evidence TEXT NOT NULL, 
	gpu_hours_reclaimed FLOAT NOT NULL, 
	PRIMARY KEY (id)
);
INSERT INTO "gpulab_idle_events" VALUES(1,1780305400.0,'reclaim','carol','','vision','half',500,'GPU idle for 60 min','{"action": "stop-server"}',0.5);
CREATE TABLE gpulab_idle_keepalives (
	user VARCHAR(255) NOT NULL, 
	server VARCHAR(255) NOT NULL, 
	used INTEGER NOT NULL, 
	until FLOAT, 
	session VARCHAR(64) NOT NULL, 
	PRIMARY KEY (user, server)
);
INSERT INTO "gpulab_idle_keepalives" VALUES('bob','',1,1780308000.0,'');
CREATE TABLE gpulab_idle_warnings (
	user VARCHAR(255) NOT NULL, 
	server VARCHAR(255) NOT NULL, 
	warned_at FLOAT NOT NULL, 
	reclaim_at FLOAT NOT NULL, 
	reason TEXT NOT NULL, 
	evidence TEXT NOT NULL, 
	PRIMARY KEY (user, server)
);
INSERT INTO "gpulab_idle_warnings" VALUES('bob','',1780304400.0,1780305300.0,'GPU idle for 60 min','{}');
CREATE TABLE gpulab_jobs (
	id INTEGER NOT NULL, 
	name VARCHAR(63) NOT NULL, 
	user VARCHAR(255) NOT NULL, 
	team VARCHAR(63) NOT NULL, 
	profile VARCHAR(63) NOT NULL, 
	job_class VARCHAR(16) NOT NULL, 
	state VARCHAR(16) NOT NULL, 
	reason TEXT NOT NULL, 
	gpu_milli INTEGER NOT NULL, 
	over_quota BOOLEAN NOT NULL, 
	notebook TEXT NOT NULL, 
	output_path TEXT NOT NULL, 
	log_path TEXT NOT NULL, 
	parameters_json TEXT NOT NULL, 
	time_limit_seconds INTEGER NOT NULL, 
	idempotency_key VARCHAR(128), 
	rerun_of INTEGER, 
	backend VARCHAR(16) NOT NULL, 
	created_at DATETIME NOT NULL, 
	started_at DATETIME, 
	finished_at DATETIME, 
	attempts INTEGER NOT NULL, 
	pid INTEGER, 
	shares_json TEXT NOT NULL, 
	kube_namespace VARCHAR(63), 
	kube_name VARCHAR(63), 
	history_json TEXT NOT NULL, 
	PRIMARY KEY (id), 
	CONSTRAINT uq_gpulab_jobs_idempotency UNIQUE (user, idempotency_key)
);
INSERT INTO "gpulab_jobs" VALUES(1,'train','alice','vision','half','batch','succeeded','the notebook ran to the end',500,0,'train.ipynb','jobs/1/out.ipynb','jobs/1/log.txt','{"lr": 0.1}',3600,NULL,NULL,'local','2026-06-01 09:00:00.000000','2026-06-01 09:01:00.000000','2026-06-01 09:30:00.000000',1,NULL,'[[0, 500]]',NULL,NULL,'[]');
CREATE TABLE gpulab_usage (
	id INTEGER NOT NULL, 
	"key" VARCHAR(255) NOT NULL, 
	team VARCHAR(63) NOT NULL, 
	user VARCHAR(255) NOT NULL, 
	profile VARCHAR(63) NOT NULL, 
	kind VARCHAR(32) NOT NULL, 
	gpu_milli INTEGER NOT NULL, 
	gpu_model VARCHAR(64), 
	over_quota BOOLEAN NOT NULL, 
	started_at DATETIME NOT NULL, 
	ended_at DATETIME, 
	PRIMARY KEY (id)
);
INSERT INTO "gpulab_usage" VALUES(1,'notebook:alice/','vision','alice','half','notebook',500,'H100-80GB',0,'2026-06-01 09:00:00.000000','2026-06-01 11:00:00.000000');
CREATE TABLE gpulab_util_sample (
	id INTEGER NOT NULL, 
	at DATETIME NOT NULL, 
	"key" VARCHAR(255) NOT NULL, 
	team VARCHAR(63) NOT NULL, 
	user VARCHAR(255) NOT NULL, 
	util_pct FLOAT NOT NULL, 
	PRIMARY KEY (id)
);
INSERT INTO "gpulab_util_sample" VALUES(1,'2026-06-01 09:00:00.000000','notebook:alice/','vision','alice',37.5);
CREATE INDEX ix_gpulab_audit_at ON gpulab_audit (at);
CREATE INDEX ix_gpulab_usage_started_at ON gpulab_usage (started_at);
CREATE UNIQUE INDEX ix_gpulab_usage_open_key ON gpulab_usage ("key") WHERE ended_at IS NULL;
CREATE INDEX ix_gpulab_usage_team ON gpulab_usage (team);
CREATE INDEX ix_gpulab_usage_key ON gpulab_usage ("key");
CREATE INDEX ix_gpulab_util_sample_at ON gpulab_util_sample (at);
CREATE INDEX ix_gpulab_jobs_user ON gpulab_jobs (user);
CREATE INDEX ix_gpulab_jobs_team ON gpulab_jobs (team);
CREATE INDEX ix_gpulab_jobs_state ON gpulab_jobs (state);
CREATE INDEX ix_gpulab_idle_events_at ON gpulab_idle_events (at);
CREATE INDEX ix_gpulab_idle_events_user ON gpulab_idle_events (user);
COMMIT;
