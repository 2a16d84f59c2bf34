-- Runs once, when the postgres data volume is first initialised (see docker-compose.yml).
-- POSTGRES_DB already created the `replaybench` database for the results store; the Prefect
-- server gets its own database on the same instance.
CREATE DATABASE prefect;
