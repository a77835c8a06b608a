"""The contract between chronoq's services.

SQL migrations and named queries, the Kafka message formats and topic naming,
the one exception root and the clock. Everything else imports from here; this
package imports nothing of ours.
"""
