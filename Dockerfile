# lumenrt's container image: build the native core and the wheel in one stage, run from a slim one.
#
#   docker build -t lumenrt:0.1.0 .            (or podman / buildah; BASE must be a Debian 12 image)
#   docker run -p 8080:8080 -v $PWD/models:/models:ro lumenrt:0.1.0
#
# The runtime stage has Python and the installed package only: no compiler, no pip cache, a
# non-root user (10001), the built-in models' cache in /tmp (the root file system may be read-only).
# Flags after the image name replace CMD (`lumenrt serve --help` lists them). Extras: add them to
# EXTRAS (e.g. --build-arg EXTRAS=torch for the PyTorch backend, CPU build).
ARG BASE=debian:bookworm-slim

FROM ${BASE} AS build
ARG EXTRAS=""
# behind a proxy with its own CA: mount its bundle and name it, e.g.
#   --volume /etc/ssl/certs/ca-certificates.crt:/etc/proxy-ca.crt:ro --build-arg PIP_CERT=/etc/proxy-ca.crt
ARG PIP_CERT=""
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc g++ make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md CMakeLists.txt ./
COPY native native
COPY src src
RUN if [ -z "$PIP_CERT" ]; then unset PIP_CERT; fi \
 && python3 -m venv /opt/lumenrt \
 && /opt/lumenrt/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/lumenrt/bin/pip install --no-cache-dir "./${EXTRAS:+[$EXTRAS]}" \
 && find /opt/lumenrt -name '__pycache__' -prune -exec rm -rf {} +

FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin lumenrt
COPY --from=build /opt/lumenrt /opt/lumenrt
ENV PATH=/opt/lumenrt/bin:$PATH \
    LUMENRT_CACHE_DIR=/tmp/lumenrt \
    PYTHONDONTWRITEBYTECODE=1
USER 10001
EXPOSE 8080 8081 8003
ENTRYPOINT ["lumenrt"]
CMD ["serve", "--host=0.0.0.0", "--http-port=8080", "--grpc-port=8081", "--tcp-port=8003", \
     "--repository=/models", "--log-format=json", "--drain-delay-s=5", "--grace-s=20"]
