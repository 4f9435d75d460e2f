DROP TABLE endpoint_reads;
