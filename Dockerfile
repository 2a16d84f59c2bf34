# replaybench image: `replaybench worker`, a Prefect process worker that runs benchmark flow runs on one
# GPU, and the `prefect deploy` that registers the deployments of prefect.yaml (docker-compose.yml).
#
#   docker build -t replaybench-worker .
#   docker build --build-arg BASE_IMAGE=pytorch/pytorch:2.4.1-cuda12.4-cudnn9-runtime -t replaybench-worker .
#
# torch (with CUDA) comes from the base image and is never replaced: the install below is
# constrained to the torch version already present, so pip either keeps it or fails loudly.
ARG BASE_IMAGE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
FROM ${BASE_IMAGE}

# REPLAYBENCH_HOME: where prefect.yaml's pull step runs flow runs from, this copy of the code.
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    REPLAYBENCH_REPORTS_DIR=/reports \
    REPLAYBENCH_HOME=/app

WORKDIR /app

# Only what the package needs: a plain `COPY . .` would also bake a local .env (the database
# password), .git and build leftovers into the image.
COPY pyproject.toml ./
COPY replaybench/ replaybench/
COPY flows/ flows/
COPY workloads/ workloads/
COPY templates/ templates/
COPY prefect.yaml ./

RUN pip show --quiet torch || { echo "pip cannot see the base image's torch; it would download another" >&2; exit 1; } \
 && python -c "import torch; print('torch==' + torch.__version__)" > /tmp/torch-constraint.txt \
 && cat /tmp/torch-constraint.txt \
 && pip install --no-cache-dir -c /tmp/torch-constraint.txt -e . "psycopg[binary]>=3.1" \
 && rm /tmp/torch-constraint.txt \
 && python -c "import torch, psycopg, prefect, replaybench, flows.benchmark; assert torch.version.cuda, 'base image torch has no CUDA'"

# Run as an unprivileged user. /reports is created here, owned by that user, so a named volume
# mounted there starts out writable by it.
RUN useradd --create-home --uid 1000 --shell /bin/sh replaybench \
 && mkdir -p /reports \
 && chown replaybench:replaybench /reports
USER replaybench

# The worker of the container's one GPU, host GPU 0; docker-compose.yml gives each worker its own.
CMD ["replaybench", "worker", "--pool", "gpu", "--gpu", "0", "--device", "0"]
