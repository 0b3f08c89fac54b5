"""Pure scheduling domain: requests, fair-queue policies, admission budget.

No grpc, protobuf or OpenTelemetry imports here; time comes from a `Clock`.
"""
