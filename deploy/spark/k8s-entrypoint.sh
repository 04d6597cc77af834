#!/bin/bash
# Entrypoint of the rollup-k8s image (deploy/container/Dockerfile): the pods that
# `spark-submit --master k8s://... --deploy-mode cluster` creates run the image with
#   driver ARGS...   -> spark-submit in client mode inside the driver pod, bound to the
#                       pod's address (SPARK_DRIVER_BIND_ADDRESS, set by Spark);
#   executor         -> the Kubernetes executor backend, from the SPARK_* variables Spark
#                       sets on executor pods (names: org.apache.spark.deploy.k8s.Constants);
#   anything else    -> run as given (spark-submit ... for local mode).
# Not run in CI (no Docker or Kubernetes on the dev machines); see deploy/spark/README.md.
set -euo pipefail

: "${SPARK_HOME:?SPARK_HOME must name the pyspark package directory}"
TINI=/usr/bin/tini

classpath="${SPARK_HOME}/jars/*"
if [ -n "${SPARK_CONF_DIR:-}" ]; then
  classpath="${SPARK_CONF_DIR}:${classpath}"
fi
if [ -n "${SPARK_CLASSPATH:-}" ]; then
  classpath="${SPARK_CLASSPATH}:${classpath}"
fi

case "${1:-}" in
  driver)
    shift
    exec "$TINI" -s -- "${SPARK_HOME}/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS}" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS}" \
      --deploy-mode client \
      "$@"
    ;;
  executor)
    shift
    java_options=()
    for name in "${!SPARK_JAVA_OPT_@}"; do  # spark.executor.extraJavaOptions, one per variable
      java_options+=("${!name}")
    done
    exec "$TINI" -s -- java "${java_options[@]}" \
      -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "${classpath}:${PWD}" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL}" \
      --executor-id "${SPARK_EXECUTOR_ID}" \
      --cores "${SPARK_EXECUTOR_CORES}" \
      --app-id "${SPARK_APPLICATION_ID}" \
      --hostname "${SPARK_EXECUTOR_POD_IP}" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID}" \
      --podName "${SPARK_EXECUTOR_POD_NAME}"
    ;;
  *)
    exec "$TINI" -s -- "$@"
    ;;
esac
