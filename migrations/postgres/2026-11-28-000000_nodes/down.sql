DROP TABLE endpoints_nodes;
