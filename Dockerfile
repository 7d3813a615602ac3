# sessionlog server image.
#   docker build -t sessionlog .
#   docker run -p 50051:50051 -v sessionlog-data:/data sessionlog
# Stage 1 builds wheels for sessionlog and every dependency; stage 2 installs them offline into
# a clean slim image and runs as an unprivileged user. The data lives in the /data volume.

FROM python:3.11-slim AS build
WORKDIR /src
# Only what the wheels are built from (see .dockerignore): the package metadata, the server and
# the Python client the CLI is built on (its own distribution, pinned by the server's). Our two
# wheels are built as `make dist` builds them, together; then the wheels of their dependencies.
COPY pyproject.toml README.md LICENSE ./
COPY server ./server
COPY client/python ./client/python
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist ./client/python . \
    && pip wheel --no-cache-dir --wheel-dir /wheels /dist/*.whl

FROM python:3.11-slim
RUN useradd --system --no-log-init --uid 10001 --user-group --home-dir /data \
        --shell /usr/sbin/nologin sessionlog \
    && mkdir -p /data \
    && chown sessionlog:sessionlog /data
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels /wheels/sessionlog_server-*.whl \
    && rm -rf /wheels
# The server reads SESSIONLOG_* for every flag (sessionlog serve --help). Inside a container it
# listens on every interface; metrics and the web console are on too (publish 9090 and 8080 to
# reach them; set either to "" to turn it off).
ENV SESSIONLOG_DATA=/data \
    SESSIONLOG_LISTEN=0.0.0.0:50051 \
    SESSIONLOG_METRICS_LISTEN=0.0.0.0:9090 \
    SESSIONLOG_HTTP_LISTEN=0.0.0.0:8080 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /data
VOLUME ["/data"]
# 50051 gRPC, 9090 Prometheus metrics (/metrics), 8080 web console.
EXPOSE 50051 9090 8080
# The standard gRPC health service: SERVING (exit 0) once the server is up; a replica only once
# it has caught up with its primary.
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["sessionlog", "health", "--server", "127.0.0.1:50051", "--timeout", "3"]
# SIGTERM (docker stop) stops the server gracefully: followers are told to reconnect, in-flight
# appends finish, LMDB closes. Give it longer than --shutdown-grace: docker stop -t 15.
STOPSIGNAL SIGTERM
ENTRYPOINT ["sessionlog"]
CMD ["serve"]
