# syntax=docker/dockerfile:1
# The kubetune operator image: `kubetune operator` on Python 3.11 with Ray 2.60.0.
#
#   docker build -t kubetune:0.1.0 .                       # the operator (default target)
#   docker build --target raycluster -t kubetune-ray:0.1.0 .   # a Ray image for the RayCluster
#
# Ray pairing: the operator is a Ray (client) driver, so the RayCluster it drives must
# run the SAME Ray version and Python minor: rayproject/ray:2.60.0-py311 (or -py311-gpu),
# or the `raycluster` target below, which also carries kubetune for the trial code.
# RAY_VERSION must satisfy pyproject.toml's ray pin (tests/unit/test_packaging.py checks).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG RAY_VERSION=2.60.0
ARG RAY_IMAGE=rayproject/ray:${RAY_VERSION}-py311

# ---------------------------------------------------------------- build: wheel + venv
FROM ${PYTHON_IMAGE} AS build
ARG RAY_VERSION
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# the dependencies first, from pyproject.toml alone, in a layer of their own: a change to
# the code alone rebuilds from `COPY operator/` on, not the ~1 GB of Ray and the rest.
# They ship manylinux wheels for CPython 3.11 (ray, scipy, cryptography, grpcio...), so no
# compiler is installed in any stage.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
      > /src/requirements.txt \
 && python -m venv /opt/kubetune \
 && /opt/kubetune/bin/pip install -r /src/requirements.txt "ray[default]==${RAY_VERSION}"
COPY README.md ./
COPY operator/ operator/
RUN python -m pip wheel --no-deps --wheel-dir /dist . \
 && /opt/kubetune/bin/pip install --no-deps /dist/kubetune-*.whl \
 && /opt/kubetune/bin/pip check \
 && /opt/kubetune/bin/pip uninstall --yes pip setuptools wheel \
 && find /opt/kubetune -name '__pycache__' -prune -exec rm -rf {} +

# ---------------------------------------------------------------- raycluster (optional target)
# The RayCluster's head and workers: the paired Ray image plus kubetune (trials import
# kubetune.trainable); not part of the default build.
FROM ${RAY_IMAGE} AS raycluster
ARG RAY_VERSION
COPY --from=build /src/requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir -r /tmp/requirements.txt "ray[default]==${RAY_VERSION}"
COPY --from=build /dist/ /tmp/dist/
RUN pip install --no-cache-dir --no-deps /tmp/dist/kubetune-*.whl && rm -rf /tmp/dist

# ---------------------------------------------------------------- the operator (final)
FROM ${PYTHON_IMAGE}
ARG RAY_VERSION
LABEL org.opencontainers.image.title="kubetune" \
      org.opencontainers.image.description="Hyperparameter tuning operator for Kubernetes on Ray" \
      dev.kubetune.ray-version="${RAY_VERSION}"
RUN groupadd --system --gid 10001 kubetune \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin kubetune
COPY --from=build /opt/kubetune /opt/kubetune
COPY crds/ /opt/kubetune/crds/
ENV PATH=/opt/kubetune/bin:$PATH \
    KUBETUNE_CRDS_DIR=/opt/kubetune/crds \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    RAY_USAGE_STATS_ENABLED=0
USER 10001:10001
WORKDIR /tmp
# 8080: /metrics (--metrics-port), 8081: result ingest of pod trials (--ingest-port),
# 8082: kopf liveness (--liveness); see charts/kubetune
EXPOSE 8080 8081 8082
ENTRYPOINT ["kubetune", "operator"]
