// SCAFFOLD (to be replaced by the activation family).
int main() { return 0; }
